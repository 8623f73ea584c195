"""The activator: the lifecycle operations of the control plane, the gateway's opener, and the reaper.

Every operation that changes a sandbox is one `Intent` handed to the `SandboxMachine`, which serializes it per
sandbox and stores it before it answers; this module adds ownership, TTL bounds and listing, and assembles the
parts the gateway and the platform use: the opener (`_opener`: single-flight wake-ups for data-plane
traffic), the reaper (`_reaper`: timeouts and the idle policy) and the telemetry behind /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime
from typing import Literal, NamedTuple, Protocol

import msgspec

from activator._activity import Activity
from activator._agent_archive import AgentArchive
from activator._catalog import TemplateCatalog
from activator._coordination import Coordinator, SoloCoordinator
from activator._errors import (
    ActivatorError,
    InvalidRequest,
    NotSupported,
    SandboxConflict,
    SandboxNotFound,
    VolumeRefused,
)
from activator._guest import require_healthy_guest
from activator._holds import HoldGate
from activator._idempotency import Idempotency
from activator._idle import IdlePolicy
from activator._logs import LogLine, SandboxLogs
from activator._machine import SandboxMachine, SandboxWatcher, runtime_call
from activator._metrics_ring import MetricsRing, Sample
from activator._opener import Opener
from activator._quota import KeyQuota
from activator._reaper import Reaper
from activator._records import (
    CreateRequest,
    Egress,
    Ingress,
    KeyLimits,
    SandboxRecord,
    SandboxState,
    new_access_token,
    new_sandbox_id,
    record_time,
)
from activator._settings import ActivatorSettings
from activator._store import Store, decode_cursor, encode_cursor
from activator._telemetry import Telemetry
from activator._template_builds import MemoryOf, TemplateBuilds, WarmBuilds
from activator._template_files import TemplateFiles
from activator._template_records import TemplateLedger, TemplateRecord
from activator._transitions import Crash, Intent, Kill, Pause, Resume, SetNetwork, SetTimeout, Start, Step
from activator._volumes import VolumeStore, resolve_mounts, volume_call
from pool import ExecutorInit, Forker, ForkImage, Runtime, SandboxStats, Template, TemplateBuilder, VolumeRecord

__all__ = ["MAX_FORKS", "Activator", "Page", "TemplateBuildSource"]

MAX_FORKS = 20  # copies per fork request (the SDK's own bound)

_log = logging.getLogger("activator")
_LISTED = (SandboxState.RUNNING, SandboxState.PAUSED)
# The stored states whose sandboxes may be reported in each state: an idle pause is reported as running, and a
# sandbox whose resume is under way as paused (the store holds a transition's target from its start on).
_STORED_AS = {
    SandboxState.RUNNING: (SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.SNAPSHOTTED),
    SandboxState.PAUSED: (SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.SNAPSHOTTED),
}


class WarmClaims(Protocol):
    """Warm pools as the activator uses them (`pool.WarmPools` on this machine, `pool.KubeWarmPools` on a cluster)."""

    async def claim(self, template: str, init: ExecutorInit) -> str | None: ...


class TemplateBuildSource(NamedTuple):
    """What template builds need: where they persist, what builds them, where uploads go (any None: no builds)."""

    ledger: TemplateLedger | None = None
    builder: TemplateBuilder | None = None
    files: TemplateFiles | None = None
    warm: WarmBuilds | None = None  # where tagged builds get warm pools (`ActivatorSettings.warm_builds` each)


class Page(NamedTuple):
    """One page of a listing, and the token of the next page when there is one."""

    records: list[SandboxRecord]
    next_token: str | None


class Activator:
    """Creates, lists, pauses, resumes and kills sandboxes on behalf of API keys, and wakes them for traffic."""

    def __init__(
        self,
        store: Store,
        runtime: Runtime,
        templates: Mapping[str, Template],
        settings: ActivatorSettings,
        *,
        clock: Callable[[], float] = time.time,
        on_halt: Callable[[str], None] | None = None,
        health_details: Callable[[], Mapping[str, object]] | None = None,
        warm: WarmClaims | None = None,
        coordinator: Coordinator | None = None,
        builds: TemplateBuildSource | None = None,
        volumes: VolumeStore | None = None,
        forker: Forker | None = None,
        watcher: SandboxWatcher | None = None,
        agent_archive: AgentArchive | None = None,
    ) -> None:
        """`on_halt(sandbox_id)` drops the gateway's idle connections into a sandbox (e.g. its `pool.drop`): called
        before a sandbox is frozen, snapshotted or killed, and when an idle sandbox's connections are all idle.
        `health_details()` adds the runtime's facts (e.g. CRIU) to `health()`. `warm` hands out started sandboxes
        to creates. `coordinator` is what gateway replicas share (`start_coordination` subscribes to it). `builds`
        is where keys' templates are built and kept (none: this server builds no templates). `volumes` is where
        keys' volumes are kept (none: this runtime has no volumes). `forker` forks sandboxes with their memory
        (none: this runtime cannot). `watcher` hears of the connections opened into sandboxes and of their halts
        (`AgentMirror`, which keeps `agent_archive`, the copy of their coding-agent sessions; none: no copy)."""
        self.settings = settings
        self.catalog = TemplateCatalog(templates, settings.template_aliases, loaded_at=clock())
        source = builds or TemplateBuildSource()
        self.template_builds = TemplateBuilds(
            self.catalog, source.ledger, source.builder, source.files, clock=clock,
            build_timeout=settings.build_timeout, warm=source.warm, warm_target=settings.warm_builds,
            snapshot_space=settings.key_snapshot_mb << 20,
        )  # fmt: skip
        self.telemetry = Telemetry()
        self._store = store
        self._runtime = runtime
        self._clock = clock
        self._health_details = health_details
        self._warm = warm
        self._volumes = volumes
        self._forker = forker
        self._on_halt = on_halt
        self._watcher = watcher
        self.agent_archive = agent_archive
        self._mounting: Counter[str] = Counter()  # volume id -> creates that mount it and are not live yet
        self._coordinator = coordinator or SoloCoordinator()
        self._logs = SandboxLogs(settings.log_lines)
        self._samples = MetricsRing(runtime, clock)
        self._idempotency = Idempotency(store, clock, shared=self._coordinator.shared)
        self._machine = SandboxMachine(
            store, runtime, self.catalog, self._logs, self.telemetry, clock=clock, on_halt=on_halt,
            coordinator=self._coordinator, watcher=watcher,
        )  # fmt: skip
        self._activity = Activity(clock, on_touch=self._coordinator.note_activity if self._coordinator.shared else None)
        self.holds = HoldGate(max_held=settings.max_held, deadline=settings.hold_deadline, telemetry=self.telemetry)
        self._opener = Opener(self._machine, runtime, self._activity, self.holds, self.telemetry)
        self._quota = KeyQuota(self._key_limits, lambda: self._machine.live)
        idle = IdlePolicy(
            self.catalog.templates, pause_after=settings.pause_after, snapshot_after=settings.snapshot_after
        )
        self._reaper = Reaper(
            self._machine, runtime, store, activity=self._activity, opener=self._opener, idle=idle, clock=clock,
            interval=settings.reap_interval, killed_retention=settings.killed_retention,
            revoked_grace=settings.revoked_key_grace, on_halt=on_halt, coordinator=self._coordinator,
        )  # fmt: skip

    @property
    def live(self) -> Mapping[str, SandboxRecord]:
        """Every sandbox that is not killed, by id (a read-only view; for metrics and health)."""
        return self._machine.live

    async def recover(self) -> None:
        """Load the keys' templates, then reconcile the stored records with the runtime after a restart; call once
        before serving."""
        await self.template_builds.load()
        await self._machine.recover()
        await self.template_builds.forget_deleted(self._templates_in_use)

    async def start_coordination(self) -> None:
        """Hear of the other replicas' transitions (a no-op alone); call once before serving."""
        await self._coordinator.start(self._machine.changed_elsewhere)

    async def run_activity_beacon(self, interval: float = 1.0) -> None:
        """Among replicas: keep telling the others which sandboxes are busy here (long requests, WebSockets), so the
        leader's idle policy leaves them alone; until cancelled."""
        while self._coordinator.shared:
            self._activity.touch_busy()
            await asyncio.sleep(interval)

    async def sandbox_exited(self, sandbox_id: str, why: str) -> None:
        """The runtime saw the sandbox's processes end on their own (its pid 1 died) and kept its files: record it
        as crashed, `why`, until it is killed or started again."""
        with contextlib.suppress(SandboxNotFound, SandboxConflict):  # killed by a request or the reaper meanwhile
            await self._machine.apply(sandbox_id, Crash(why))

    async def kill_all(self) -> int:
        """Kill every sandbox of every key (the operator's `agent-sandbox cleanup`); returns how many there were."""
        ids = list(self._machine.live)
        await asyncio.gather(*(self._kill_quietly(sandbox_id) for sandbox_id in ids))
        return len(ids)

    async def create(self, owner: str, request: CreateRequest) -> SandboxRecord:
        """Start a sandbox from `request.template` (a name or an alias) for the API key `owner`."""
        template = self.catalog.resolve(request.template, owner)
        self._refuse_unenforced(request.egress)
        record = self._new_record(owner, request, template)
        if not request.volume_mounts:
            async with self._quota.admit(record):  # QuotaExceeded (429) past the key's limits, before anything starts
                return await self._start(record)
        if template.memory_image:  # the restored processes never saw the mounts; CRIU would not make them
            raise NotSupported(
                "a sandbox created from a snapshot with memory mounts no volumes: snapshot with mode='filesystem'"
            )
        store = self._volume_store()
        mounts = await volume_call(resolve_mounts, store, owner, request.volume_mounts)
        record = msgspec.structs.replace(record, volumes=mounts)
        self._mounting.update(mount.volume_id for mount in mounts)  # a destroy meanwhile is refused
        try:
            async with self._quota.admit(record):
                return await self._start(record)
        finally:
            self._mounting.subtract(mount.volume_id for mount in mounts)

    async def _start(self, record: SandboxRecord) -> SandboxRecord:
        claimed = None
        # A ready sandbox gets the caller's init and keeps running: `Start` is a no-op. Not one with volumes: they
        # are mounted as a sandbox starts.
        if self._warm is not None and not record.volumes:
            claimed = await self._warm.claim(record.template, self._machine.spec_for(record).init)
            record = record if claimed is None else msgspec.structs.replace(record, id=claimed)
        try:
            if claimed is not None:  # it was started before its rules were known
                rules = record.egress.rules
                await runtime_call(f"set the egress of sandbox {claimed}", self._runtime.set_egress(claimed, rules))
            return (await self._machine.apply(record.id, Start(record))).record
        except BaseException:
            if claimed is not None:  # `Start` failed after the claim: the sandbox is nobody's, don't leak it
                await self._runtime.stop(claimed)
            raise

    def _volume_store(self) -> VolumeStore:
        if self._volumes is None:
            raise NotSupported("volumes are not supported by this server's runtime (they are the local runtime's)")
        return self._volumes

    async def create_volume(self, owner: str, name: str) -> VolumeRecord:
        """A new, empty volume of the key's; 409 if it has one of that name."""
        return await volume_call(self._volume_store().create, owner, name)

    async def volumes(self, owner: str) -> list[VolumeRecord]:
        """The key's volumes, oldest first."""
        return await volume_call(self._volume_store().owned, owner)

    async def volume(self, owner: str, volume_id: str) -> VolumeRecord:
        """The key's volume `volume_id` (404 otherwise)."""
        return await volume_call(self._volume_store().get, owner, volume_id)

    async def volume_files(self, volume_id: str, token: str) -> VolumeStore:
        """The store, for the content calls of the volume the bearer `token` opens; 401 for any other token."""
        store = self._volume_store()
        if not token or await volume_call(store.by_token, volume_id, token) is None:
            raise VolumeRefused(401, "the volume content API needs 'Authorization: Bearer <the volume's token>'")
        return store

    async def destroy_volume(self, owner: str, volume_id: str) -> None:
        """Remove the key's volume and its files; 409 while a sandbox (running or paused) mounts it."""
        store = self._volume_store()
        await volume_call(store.get, owner, volume_id)
        users = sorted(r.id for r in self._machine.live.values() if any(m.volume_id == volume_id for m in r.volumes))
        if users:
            raise SandboxConflict(f"volume {volume_id} is mounted by sandbox {', '.join(users)}: kill it first")
        if self._mounting[volume_id] > 0:
            raise SandboxConflict(f"volume {volume_id} is being mounted by a sandbox starting now: kill it first")
        await volume_call(store.destroy, owner, volume_id)

    async def _key_limits(self, owner: str) -> KeyLimits:
        """The limits of the key `owner` (read now: `keys update` applies to the next create), over the server's."""
        key = await self._store.key(owner)
        return (key.limits if key is not None else KeyLimits()).over(self.settings.key_limits)

    def last_activity(self, sandbox_id: str) -> float:
        """Clock time of the sandbox's last traffic or wake-up (what the idle policy counts from)."""
        return self._activity.last(sandbox_id)

    def get(self, owner: str, sandbox_id: str) -> SandboxRecord:
        """The sandbox's current record; SandboxNotFound if it is killed, unknown, or another key's."""
        return _owned_by(owner, sandbox_id, self._machine.live.get(sandbox_id))

    async def lookup(self, owner: str, sandbox_id: str) -> SandboxRecord:
        """`get`, also for a sandbox another replica created a moment ago (read from the store on a miss)."""
        return _owned_by(owner, sandbox_id, await self._machine.load(sandbox_id))

    async def kill(self, owner: str, sandbox_id: str) -> None:
        """Kill the sandbox; a second kill finds nothing (SandboxNotFound)."""
        await self._owned(owner, sandbox_id, Kill())

    async def set_timeout(self, owner: str, sandbox_id: str, seconds: float) -> None:
        """Make the sandbox expire `seconds` from now (of running time, if it is paused)."""
        await self._owned(owner, sandbox_id, SetTimeout(self._ttl(seconds)))

    async def refresh(self, owner: str, sandbox_id: str, seconds: float) -> None:
        """Keep the sandbox alive for at least `seconds` more."""
        await self._owned(owner, sandbox_id, SetTimeout(self._ttl(seconds), extend_only=True))

    async def pause(self, owner: str, sandbox_id: str, *, memory: bool = True, healthy_guest: bool = False) -> None:
        """E2B's pause: snapshot the sandbox and stop its TTL; SandboxConflict if it is already paused.

        Not `memory` (`mode="filesystem"`): files only, its processes are gone whatever the runtime could keep.
        `healthy_guest` (`strict=True`): a running sandbox whose executor does not answer is not paused
        (GuestUnresponsive, 503; see `_guest`).
        """
        if healthy_guest:
            await require_healthy_guest(self._runtime, await self.lookup(owner, sandbox_id))
        await self._owned(owner, sandbox_id, Pause(memory=memory))

    async def connect(
        self, owner: str, sandbox_id: str, seconds: float, *, memory: bool = True
    ) -> tuple[SandboxRecord, bool]:
        """Resume the sandbox if it is not running and lengthen its TTL to `seconds`; True when it was paused
        by the user (an idle pause is invisible: the sandbox was running as far as the client knew).

        Not `memory` (`on_resume="reboot"`): a user-paused sandbox drops its memory image and starts over its files.
        """
        step = await self._owned(owner, sandbox_id, Resume(self._ttl(seconds), memory=memory))
        return step.record, step.before is not None and step.before.user_paused

    async def once(
        self, owner: str, key: str | None, request: tuple[str, bytes], create: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        """The answer of `create()` run at most once per Idempotency-Key `key` of `owner`, given the (path, body)
        of the request (see `_idempotency`); without a key, simply run."""
        if key is None:
            return await create()
        return await self._idempotency.once(owner, key, request, create)

    async def create_snapshot(
        self, owner: str, sandbox_id: str, name: str, tag: str, *, memory: bool | None
    ) -> TemplateRecord:
        """E2B's create_snapshot: the sandbox's files, or with `memory` (E2B's mode "full") its memory and files, as
        the build `tag` of a template (`name`, or "" for one named by its ID), which sandboxes are then created
        from; the sandbox is frozen only while they are taken. A sandbox created from a snapshot with memory goes
        on from it as a fork would. `memory` None is E2B's default: memory where it can be imaged, files
        otherwise. NotSupported for memory where it cannot (`_memory_imager`); a user-paused sandbox is
        SandboxConflict: connect to it first.
        """
        if self.template_builds.refusal:
            raise NotSupported(self.template_builds.refusal)
        source = self.get(owner, sandbox_id)
        if memory is None:
            memory = await self._images_memory(source)
        elif memory:
            await self._memory_imager(source, "snapshotted with its memory")
        if source.user_paused:
            raise SandboxConflict(f"sandbox {sandbox_id} is paused: connect to it before snapshotting it")
        await self._opener.ensure_running(sandbox_id)  # an idle-paused one runs again (to its owner it never stopped)

        async def take(record: SandboxRecord) -> TemplateRecord:
            if record.state is SandboxState.SNAPSHOTTED:  # the idle policy snapshotted it again meanwhile
                raise SandboxConflict(f"sandbox {sandbox_id} was paused meanwhile: try again")
            template = self.catalog.templates[record.template]
            kept = None
            if memory:
                self._halt_connections(sandbox_id)
                kept = MemoryOf(access_token=record.access_token)
            builds = self.template_builds
            return await builds.snapshot(owner, name, tag, sandbox_id, template, self._templates_in_use, memory=kept)

        return await self._machine.holding(sandbox_id, take)

    async def fork(
        self, owner: str, sandbox_id: str, *, count: int, lifetime: float | None
    ) -> list[SandboxRecord | ActivatorError]:
        """E2B's fork: `count` new sandboxes from one image of the running sandbox's memory and files (it is frozen
        while the image is taken, then runs on, its id and deadline untouched); each fork's outcome on its own.

        A fork has the source's template, metadata, env vars, rules and lifecycle as they were at the image, its
        own id and tokens, and `lifetime` (its timeout in seconds; none: E2B's default for forks,
        `default_timeout_v1`). NotSupported where memory is never imaged (`_memory_imager`); SandboxConflict for
        a paused sandbox (connect to it first)."""
        source = self.get(owner, sandbox_id)
        forker = await self._memory_imager(source, "forked")
        if not 1 <= count <= MAX_FORKS:
            raise InvalidRequest(f"count must be between 1 and {MAX_FORKS}, not {count}")
        seconds = self._ttl(self.settings.default_timeout_v1 if lifetime is None else lifetime)
        if source.user_paused:
            raise SandboxConflict(f"sandbox {sandbox_id} is paused: connect to it before forking it")
        await self._opener.ensure_running(sandbox_id)  # an idle-paused one runs again (to its owner it never stopped)

        async def take(record: SandboxRecord) -> tuple[SandboxRecord, ForkImage]:
            if record.state is not SandboxState.RUNNING:  # the idle policy paused it again meanwhile
                raise SandboxConflict(f"sandbox {sandbox_id} was paused meanwhile: try again")
            self._halt_connections(sandbox_id)
            image = await runtime_call(f"fork sandbox {sandbox_id}", forker.fork_image(sandbox_id, record.access_token))
            return record, image  # the record of the moment of the image: its rules are the ones its memory has

        at_image, image = await self._machine.holding(sandbox_id, take)
        try:
            starts = (self._start_fork(at_image, image, seconds) for _ in range(count))
            outcomes = await asyncio.gather(*starts, return_exceptions=True)
        finally:
            await forker.drop_fork_image(image)
        for outcome in outcomes:
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
        return [_fork_outcome(outcome) for outcome in outcomes]

    def _halt_connections(self, sandbox_id: str) -> None:
        """The gateway's idle connections into the sandbox go before its memory is imaged: in a copy they would be
        established sockets to nowhere."""
        if self._on_halt is not None:
            self._on_halt(sandbox_id)

    async def _images_memory(self, source: SandboxRecord) -> bool:
        """Whether `source`'s memory can be imaged (`_memory_imager` would not refuse)."""
        try:
            await self._memory_imager(source, "imaged")
        except NotSupported:
            return False
        return True

    async def _memory_imager(self, source: SandboxRecord, done: str) -> Forker:
        """The runtime's forker, which images `source`'s memory (to be `done` with it); NotSupported where the runtime
        cannot, and for a sandbox with volumes or of a freeze-only template (their memory is never imaged)."""
        forker = self._forker
        refusal = f"a sandbox is {done} only where memory is imaged: the local runtime's, with CRIU"
        if forker is None or (refusal := await forker.fork_refusal()):
            raise NotSupported(refusal)
        if self._machine.freeze_only(source):
            what = "a sandbox with volumes" if source.volumes else f"a sandbox of template {source.alias!r}"
            raise NotSupported(f"{what} is not {done}: its memory is never imaged")
        return forker

    async def _start_fork(
        self, source: SandboxRecord, image: ForkImage, lifetime: float
    ) -> SandboxRecord | ActivatorError:
        now, ingress = self._clock(), source.ingress
        if ingress.traffic_access_token is not None:
            ingress = msgspec.structs.replace(ingress, traffic_access_token=new_access_token())
        record = msgspec.structs.replace(
            source, id=new_sandbox_id(), state=SandboxState.RUNNING, created_at=now, started_at=now,
            end_at=now + lifetime, timeout=lifetime, remaining=0.0, pause_reason=None, snapshot_kind=None, crash=None,
            access_token=new_access_token() if source.access_token is not None else None, ingress=ingress,
        )  # fmt: skip
        try:
            async with self._quota.admit(record):
                return (await self._machine.apply(record.id, Start(record, fork=image))).record
        except ActivatorError as exc:
            return exc

    async def delete_template(self, owner: str, name: str) -> None:
        """Delete `owner`'s template (`TemplateBuilds.delete`); a snapshot's files stay while a live sandbox was
        created from it (its restore may need them)."""
        await self.template_builds.delete(owner, name, self._templates_in_use)

    def _templates_in_use(self) -> list[Template]:
        """The templates of the live sandboxes (the runtime keeps the layers of the ones still starting)."""
        templates = self.catalog.templates
        return [templates[r.template] for r in self._machine.live.values() if r.template in templates]

    def snapshots(self, owner: str, *, sandbox_id: str = "", name: str = "") -> list[TemplateRecord]:
        """`owner`'s snapshots a create may start from (a tag names a build), oldest first: of the sandbox
        `sandbox_id`, and named `name`, when given."""
        found = [
            record
            for record in self.template_builds.snapshots(owner)
            if record.tags
            and (not sandbox_id or record.snapshot_of == sandbox_id)
            and (not name or record.name == name)
        ]
        return sorted(found, key=lambda record: (record.created_at, record.template_id))

    async def update_network(
        self, owner: str, sandbox_id: str, egress: Egress, *, allow_internet_access: bool | None
    ) -> None:
        """E2B's update_network: replace the sandbox's egress rules (checked by `_network` already)."""
        self._refuse_unenforced(egress)
        await self._owned(owner, sandbox_id, SetNetwork(egress, allow_internet_access))

    async def resume(self, owner: str, sandbox_id: str, seconds: float) -> SandboxRecord:
        """Resume a paused sandbox with a TTL of at least `seconds`; SandboxConflict if it runs (E2B's v1 resume)."""
        return (await self._owned(owner, sandbox_id, Resume(self._ttl(seconds), only_if_paused=True))).record

    async def metrics(self, owner: str, sandbox_id: str) -> tuple[float, SandboxStats | None]:
        """The sandbox's latest resource use (at most `SAMPLE_INTERVAL` old) and when it was read; None while it
        is snapshotted (no processes)."""
        if self.get(owner, sandbox_id).state is SandboxState.SNAPSHOTTED:
            return self._clock(), None
        await self._samples.sample_if_due(sandbox_id)
        newest = self._samples.newest(sandbox_id)
        return (newest.at, newest.stats) if newest else (self._clock(), None)

    async def metrics_between(self, owner: str, sandbox_id: str, start: int | None, end: int | None) -> list[Sample]:
        """The sandbox's kept samples within [start, end] (unix seconds; see `_metrics_ring`), a fresh one first
        taken when it runs and its newest is due."""
        if self.get(owner, sandbox_id).state is SandboxState.RUNNING:
            await self._samples.sample_if_due(sandbox_id)
        return self._samples.between(sandbox_id, start, end)

    async def run_metrics_sampler(self) -> None:
        """Keep the metrics history of running sandboxes (one sample per `SAMPLE_INTERVAL`) until cancelled."""
        await self._samples.run(lambda: self._machine.live)

    def logs(self, owner: str, sandbox_id: str) -> list[LogLine]:
        """The sandbox's lifecycle log lines, oldest first (see `_logs`)."""
        self.get(owner, sandbox_id)
        return self._logs.lines(sandbox_id)

    async def list(
        self,
        owner: str,
        *,
        states: Collection[SandboxState] = _LISTED,
        metadata: Mapping[str, str] | None = None,
        template: str | None = None,
        started_after: datetime | None = None,
        limit: int = 100,
        next_token: str | None = None,
        order: Literal["asc", "desc"] = "desc",
    ) -> Page:
        """`owner`'s sandboxes reported in `states` (running / paused, as E2B sees them) whose metadata contain
        `metadata` and that (re)started at or after `started_after`, by creation time, a page at a time.

        `started_after` is compared with the start time as the answer renders it (`record_time`, to the
        microsecond), so a sandbox's own `startedAt` read back from a listing always includes it.

        Each sandbox as `get` answers it: the route cache's record wins over the stored one, which during a
        transition is already its target (a sandbox being snapshotted is listed running until it is snapshotted).
        """
        if not 1 <= limit <= 100:
            raise InvalidRequest(f"limit must be between 1 and 100, not {limit}")
        wanted, reported = dict(metadata or {}), frozenset(states)
        live = dict(self._machine.live)  # a copy: `keep` may run on another thread

        def current(record: SandboxRecord) -> SandboxRecord:
            return live.get(record.id, record)

        def keep(stored: SandboxRecord) -> bool:
            record = current(stored)
            return (
                record.reported_state in reported
                and wanted.items() <= record.metadata.items()
                and template in (None, record.template, record.alias)
                and (started_after is None or record_time(record.started_at) >= started_after)
            )

        stored = {state for wanted_state in reported for state in _STORED_AS.get(wanted_state, ())}
        after = decode_cursor(next_token) if next_token else None
        found = [
            current(record)
            for record in await self._store.page(owner, stored, order=order, after=after, count=limit + 1, keep=keep)
        ]
        more = len(found) > limit
        return Page(found[:limit], encode_cursor(found[limit - 1]) if more else None)

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket:
        """The gateway's opener: a connected socket to `port` in the sandbox, woken first when needed.

        Traffic wakes a sandbox paused by the idle policy, or a paused one whose lifecycle has auto-resume.
        SandboxNotFound: unknown, killed, or paused and not woken by traffic; PortNotOpen: nothing accepts on
        the port; HoldQueueFull / HoldTimeout / ClientGone: too many requests wait already, the resume took too
        long, or the client left while held.
        """
        sock = await self._opener.open_upstream(sandbox_id, port)
        if self._watcher is not None:
            self._watcher.opened(sandbox_id, port)
        return sock

    def leaving(self, sandbox_id: str) -> bool:
        """Whether a transition is taking the sandbox away from running right now."""
        return self._machine.leaving(sandbox_id)

    async def ingress(self, sandbox_id: str) -> Ingress | None:
        """What the gateway enforces on the sandbox's ports but envd's (traffic token, Host mask); None when it is
        unknown or killed. From the route cache: no store read per request (`SandboxMachine.load`)."""
        record = await self._machine.load(sandbox_id)
        return None if record is None else record.ingress

    async def ensure_running(self, sandbox_id: str) -> None:
        """Return once the sandbox runs, waking it (single flight, held and bounded) when traffic may wake it."""
        await self._opener.ensure_running(sandbox_id)

    def touch(self, sandbox_id: str) -> None:
        """Note traffic to the sandbox for the idle policy: a timestamp in memory, never a store write."""
        self._opener.touch(sandbox_id)

    async def run_reaper(self) -> None:
        """Enforce timeouts and the idle policy every `reap_interval` seconds until cancelled."""
        await self._reaper.run()

    async def reap_once(self) -> None:
        """One pass of the reaper (see `_reaper`)."""
        await self._reaper.reap_once()

    def census(self) -> Counter[tuple[SandboxState, str]]:
        """How many live sandboxes are in each (state, pause reason or "") pair."""
        return Counter((r.state, r.pause_reason or "") for r in self._machine.live.values())

    def health(self) -> dict[str, object]:
        """Details for `GET /health`: sandboxes by state, held requests, and the runtime's own facts."""
        by_state = Counter(record.state.value for record in self._machine.live.values())
        details: dict[str, object] = {
            "sandboxes": {state.value: by_state[state.value] for state in SandboxState if state.value != "killed"},
            "held_requests": self.holds.held,
        }
        if self._health_details is not None:
            details.update(self._health_details())
        return details

    def _new_record(self, owner: str, request: CreateRequest, template: Template) -> SandboxRecord:
        timeout, now = self._ttl(request.timeout), self._clock()
        return SandboxRecord(
            id=new_sandbox_id(),
            owner=owner,
            template=template.name,
            alias=request.template,
            state=SandboxState.RUNNING,
            created_at=now,
            started_at=now,
            end_at=now + timeout,
            timeout=timeout,
            metadata=request.metadata,
            env_vars=request.env_vars,
            access_token=new_access_token() if request.secure else None,
            lifecycle=request.lifecycle,
            secure=request.secure,
            allow_internet_access=request.allow_internet_access,
            egress=request.egress,
            ingress=Ingress(
                traffic_access_token=(
                    new_access_token() if not request.public_traffic or template.private_ports else None
                ),
                mask_request_host=request.mask_request_host,
                private_ports=template.private_ports if request.public_traffic else None,
                local_host_ports=template.local_host_ports,
                https_ports=request.https_ports,
            ),
            cpu_count=template.resources.cpu_count,
            memory_mb=template.resources.memory_mb,
            disk_mb=template.resources.disk_mb,
            client_id=self.settings.client_id,
            envd_version=self.settings.envd_version,
            domain=self.settings.domain,
        )

    async def _kill_quietly(self, sandbox_id: str) -> None:
        try:
            await self._machine.apply(sandbox_id, Kill("cleanup"))
        except SandboxNotFound:
            pass
        except ActivatorError as exc:
            _log.warning("sandbox %s: could not kill it: %s", sandbox_id, exc)

    async def _owned(self, owner: str, sandbox_id: str, intent: Intent) -> Step:
        await self.lookup(owner, sandbox_id)  # owners never change, so checking outside the sandbox's lock is safe
        step = await self._machine.apply(sandbox_id, intent)
        if step.action in ("thaw", "restore"):
            self._activity.touch(sandbox_id)  # woken by the API: the idle clock starts again
        return step

    def _refuse_unenforced(self, egress: Egress) -> None:
        """Rules the runtime cannot enforce (domains, on some) are refused (400), never accepted and ignored."""
        refusal = self._runtime.capabilities().domain_refusal
        if refusal and egress.rules.domains:
            raise InvalidRequest(refusal)

    def _ttl(self, seconds: float) -> float:
        if not 0 <= seconds <= self.settings.max_timeout:
            raise InvalidRequest(f"Timeout must be between 0 and {self.settings.max_timeout} seconds, not {seconds}")
        return float(seconds)


def _owned_by(owner: str, sandbox_id: str, record: SandboxRecord | None) -> SandboxRecord:
    if record is None or record.owner != owner:
        raise SandboxNotFound(f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")
    return record


def _fork_outcome(outcome: SandboxRecord | BaseException) -> SandboxRecord | ActivatorError:
    """One fork's entry in the answer: an error of any kind is that fork's alone (the others started)."""
    if isinstance(outcome, SandboxRecord | ActivatorError):
        return outcome
    _log.error("a fork failed to start", exc_info=outcome)
    return ActivatorError(f"the fork failed to start: {outcome}")
