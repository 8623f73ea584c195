"""Carries out the plans of `_transitions`: one transition at a time per sandbox, stored before acknowledged.

Order inside a transition: plan -> store the new record -> runtime action -> update the in-memory route cache.
Storing the intent first means a crash mid-transition leaves a record that `recover` can finish or undo
(`Reassert`, given what the runtime found: processes alive, a snapshot on disk, or neither). When the runtime
action fails, the previous record is stored again and the error goes to the caller.

Every transition that changes the state writes one structured line to the `activator` logger:
`sandbox=<id> transition=<from>-><to> reason=<token> ms=<runtime action time>` (plus `kind=` for snapshots).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, TypeVar

import msgspec
from msgspec.structs import replace

from activator._catalog import TemplateCatalog
from activator._coordination import Coordinator, SoloCoordinator
from activator._errors import ActivatorError, SandboxNotFound
from activator._logs import LogLevel, LogLine, SandboxLogs
from activator._records import SandboxRecord, SandboxState
from activator._store import Store
from activator._telemetry import Telemetry
from activator._transitions import Intent, Reassert, Step, plan
from pool import CheckpointFailed, ExecutorInit, PoolError, Runtime, SandboxSpec, kube_shapes

__all__ = ["Guard", "SandboxMachine", "SandboxWatcher", "runtime_call"]

T = TypeVar("T")
Guard = Callable[[], bool]  # checked under the sandbox's lock just before a transition; False skips it
WATCHER_DEADLINE = 10.0  # seconds a pause, snapshot or kill waits for its `SandboxWatcher.halting` at most
_log = logging.getLogger("activator")
_RUNNING = SandboxState.RUNNING


class SandboxWatcher(Protocol):
    """Told when clients reach a sandbox and before it stops running (the coding-agent sessions' mirror)."""

    def opened(self, sandbox_id: str, port: int) -> None:
        """A connection to `port` in the sandbox was opened for a client."""

    async def halting(self, before: SandboxRecord | None, after: SandboxRecord) -> None:
        """A transition from `before` is about to pause, snapshot or kill the sandbox (`after`): awaited under its
        lock, before the runtime acts, so the processes still run. Bounded by `WATCHER_DEADLINE`; what it raises
        is logged, never stops the transition."""

    def halted(self, record: SandboxRecord) -> None:
        """The runtime paused, snapshotted or killed the sandbox (`record`) as `halting` announced."""


class SandboxMachine:
    """Serializes, stores and performs every sandbox transition, and mirrors live records in memory."""

    def __init__(
        self,
        store: Store,
        runtime: Runtime,
        catalog: TemplateCatalog,
        logs: SandboxLogs,
        telemetry: Telemetry,
        *,
        clock: Callable[[], float] = time.time,
        on_halt: Callable[[str], None] | None = None,
        coordinator: Coordinator | None = None,
        watcher: SandboxWatcher | None = None,
    ) -> None:
        """`coordinator` is what replicas share (`--redis-url`); when it is shared, every transition takes the
        sandbox's lock across replicas and starts from the stored record, and others hear of its end. `watcher`
        hears of each transition that stops a sandbox running, before it acts."""
        self._store = store
        self._coordinator = coordinator or SoloCoordinator()
        self._runtime = runtime
        self._catalog = catalog
        self._logs = logs
        self._telemetry = telemetry
        self._clock = clock
        self._on_halt = on_halt
        self._watcher = watcher
        # The route cache: id -> current record of every sandbox that is not killed. Written only by `apply`
        # (under that sandbox's lock) and `recover`, so a reader on the event loop sees whole transitions.
        self._live: dict[str, SandboxRecord] = {}
        # Ids whose transition away from running is under way (between its guard and its end). The opener holds
        # new connections to these instead of connecting to processes about to freeze or vanish.
        self._leaving: set[str] = set()
        # One lock per sandbox id, guarding the plan -> store -> act -> cache sequence of its transitions. Weak
        # values: a lock disappears once no transition holds or awaits it, so the dict stays as small as the work.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # Re-reads of records other replicas changed: ids queued (so a burst of messages costs one read), and
        # the tasks doing it (kept so they are not collected mid-flight).
        self._refreshing: set[str] = set()
        self._refreshes: set[asyncio.Task[None]] = set()
        # Ids the store did not know when last asked -> monotonic time of that read (`load`); bounded.
        self._absent: dict[str, float] = {}

    @property
    def live(self) -> Mapping[str, SandboxRecord]:
        """The current record of every sandbox that is not killed (read-only view of the route cache)."""
        return self._live

    def leaving(self, sandbox_id: str) -> bool:
        """Whether a transition is taking the sandbox away from running right now."""
        return sandbox_id in self._leaving

    async def apply(self, sandbox_id: str, intent: Intent, *, guard: Guard | None = None) -> Step:
        """Carry out `intent` on the sandbox; returns what was done. Raises what `plan` or the runtime raise.

        `guard` runs under the lock, after the sandbox is marked leaving and before anything is stored; when
        it says False the transition is skipped (the idle policy uses it to back off when traffic came).
        """
        async with self._lock(sandbox_id), self._coordinator.sandbox_lock(sandbox_id):
            if self._coordinator.shared:  # another replica may have changed it since we last heard
                await self._reload(sandbox_id)
            before = self._live.get(sandbox_id)
            step = plan(before, intent, self._clock())
            if step.action is None and step.record == before:
                return step
            leaving = before is not None and before.state is _RUNNING and step.record.state is not _RUNNING
            if leaving:
                self._leaving.add(sandbox_id)
            try:
                if guard is not None and not guard():
                    return Step(before, None, None, before) if before else step
                return await self._carry_out(step, intent)
            finally:
                self._leaving.discard(sandbox_id)
                if self._coordinator.shared and self._live.get(sandbox_id) is not before:
                    await self._coordinator.publish_changed(sandbox_id)

    async def holding(self, sandbox_id: str, work: Callable[[SandboxRecord], Awaitable[T]]) -> T:
        """Run `work` on the sandbox's live record with no transition of it in between (a snapshot's copy of its
        files); SandboxNotFound when it is killed or unknown."""
        async with self._lock(sandbox_id), self._coordinator.sandbox_lock(sandbox_id):
            if self._coordinator.shared:
                await self._reload(sandbox_id)
            record = self._live.get(sandbox_id)
            if record is None:
                raise SandboxNotFound("sandbox doesn't exist or you don't have access to it")
            return await work(record)

    async def load(self, sandbox_id: str) -> SandboxRecord | None:
        """The sandbox's live record, read from the store when this replica has not heard of it yet (a sandbox
        another replica created a moment ago); None when it is unknown or killed.

        An id the store did not know is not asked for again within `_ABSENT_SECONDS` (until a notice names it):
        requests for made-up hostnames must not each cost a read of the store (on Kubernetes, the API server).
        """
        record = self._live.get(sandbox_id)
        if record is not None or not self._coordinator.shared:
            return record
        missed = self._absent.get(sandbox_id)
        if missed is not None and time.monotonic() - missed < _ABSENT_SECONDS:
            return None
        record = await self.reread(sandbox_id)
        if record is None:
            if len(self._absent) >= _ABSENT_KEPT:
                self._absent.clear()
            self._absent[sandbox_id] = time.monotonic()
        return record

    @property
    def shared(self) -> bool:
        """Whether other replicas may change sandboxes behind this one's back."""
        return self._coordinator.shared

    async def reread(self, sandbox_id: str) -> SandboxRecord | None:
        """The stored record, read again now (the cached one proved stale)."""
        async with self._lock(sandbox_id):
            return await self._reload(sandbox_id)

    def changed_elsewhere(self, sandbox_id: str) -> None:
        """Another replica changed the sandbox: re-read its record (the coordinator's subscriber calls this)."""
        self._absent.pop(sandbox_id, None)
        if sandbox_id in self._refreshing:
            return
        self._refreshing.add(sandbox_id)
        task = asyncio.create_task(self._refresh(sandbox_id))
        self._refreshes.add(task)
        task.add_done_callback(self._refreshes.discard)

    async def _refresh(self, sandbox_id: str) -> None:
        try:
            async with self._lock(sandbox_id):
                self._refreshing.discard(sandbox_id)
                await self._reload(sandbox_id)
        except ActivatorError as exc:
            _log.warning(
                "sandbox %s: could not re-read its record after another replica changed it: %s", sandbox_id, exc
            )

    async def _reload(self, sandbox_id: str) -> SandboxRecord | None:
        """Replace the cached record by the stored one (under the sandbox's lock)."""
        record = await self._store.get(sandbox_id)
        if record is None or record.state is SandboxState.KILLED:
            if self._live.pop(sandbox_id, None) is not None:
                self._logs.drop(sandbox_id)
            return None
        if self._live.get(sandbox_id) != record:
            self._live[sandbox_id] = record
            self._note_spec(record)
        return record

    def _note_spec(self, record: SandboxRecord) -> None:
        """Tell the runtime how to reach the sandbox's executor (a record of a template no longer configured
        has nothing to tell: its sandbox can only be killed)."""
        if record.template in self._catalog.templates:
            self._runtime.note_spec(self.spec_for(record))

    async def _carry_out(self, step: Step, intent: Intent) -> Step:
        await self._store.put(step.record)
        seconds = 0.0
        if step.action is not None:
            halting = step.record.state is not _RUNNING
            if halting:
                await self._watch_halting(step)
            if halting and self._on_halt is not None:
                self._on_halt(step.record.id)  # idle upstream connections go before the processes do
            began = time.perf_counter()
            step = await self._act_or_undo(step)
            seconds = time.perf_counter() - began
            if halting and self._watcher is not None:
                self._watcher.halted(step.record)
        self._remember(step)
        self._report(step, intent, seconds)
        return step

    async def _watch_halting(self, step: Step) -> None:
        if self._watcher is None:
            return
        try:
            async with asyncio.timeout(WATCHER_DEADLINE):
                await self._watcher.halting(step.before, step.record)
        except Exception as exc:  # the watcher's trouble is not the transition's
            _log.warning("sandbox %s: its watcher failed before it halted: %s", step.record.id, exc or type(exc))

    async def recover(self) -> None:
        """After a restart: load the stored live records and reconcile them with the runtime's sandboxes (alone;
        a replica among others only loads them)."""
        alive = await runtime_call("recover its sandboxes", self._runtime.recover())
        snapshotted, crashes = self._runtime.snapshotted_ids(), self._runtime.crashes()
        records = await self._store.live()
        self._live.update((record.id, record) for record in records)
        for record in records:
            self._note_spec(record)
        if self._coordinator.shared:
            # Other replicas are mid-transition on some of these right now, so facts read here may be stale: a
            # replica that joins only loads the records. Sandboxes are in the cluster, not in a crashed process.
            return
        for record in records:
            crash = crashes.get(record.id)
            facts = Reassert(alive=record.id in alive, snapshotted=record.id in snapshotted, crash=crash)
            await self._recover_one(record.id, self.apply(record.id, facts))
        for orphan in (alive | snapshotted) - self._live.keys():
            _log.warning("sandbox %s: removing it from the runtime, it has no record", orphan)
            await self._recover_one(orphan, runtime_call(f"stop sandbox {orphan}", self._runtime.stop(orphan)))

    @staticmethod
    async def _recover_one(sandbox_id: str, work: Awaitable[object]) -> None:
        """One sandbox that cannot be recovered must not keep the server from starting: log it and go on."""
        try:
            await work
        except ActivatorError as exc:
            _log.warning("sandbox %s: could not recover it: %s", sandbox_id, exc)

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        lock = self._locks.get(sandbox_id)
        if lock is None:
            lock = self._locks[sandbox_id] = asyncio.Lock()
        return lock

    async def _act_or_undo(self, step: Step) -> Step:
        try:
            return await self._act(step)
        except Exception as exc:  # undo for any failure, then let it go on to the caller unchanged
            await self._store.put(step.before or replace(step.record, state=SandboxState.KILLED))
            self._log(step.record.id, "error", str(exc))
            raise

    async def _act(self, step: Step) -> Step:
        """Run the step's runtime action; a snapshot's kind goes into the record (stored once more)."""
        record = step.record
        match step.action:
            case "start":
                spec = msgspec.structs.replace(self.spec_for(record), fork=step.fork)
                await runtime_call(f"start sandbox {record.id}", self._runtime.start(spec))
            case "restore":
                restored = self._runtime.restore(self.spec_for(record), memory=step.memory)
                await runtime_call(f"restore sandbox {record.id}", restored)
            case "snapshot":
                try:
                    if step.memory and self.freeze_only(record):
                        what = "a sandbox with volumes" if record.volumes else f"template {record.alias!r}"
                        raise CheckpointFailed(f"{what} is not snapshotted with its memory")
                    info = await self._runtime.snapshot(record.id, memory=step.memory)
                except CheckpointFailed as exc:  # its processes would be lost: it stays, frozen, as it was
                    await runtime_call(f"freeze sandbox {record.id}", self._runtime.freeze(record.id))
                    self._log(record.id, "warn", f"{exc}; kept frozen instead (memory kept, processes kept)")
                    step = step._replace(record=replace(record, state=SandboxState.PAUSED, snapshot_kind=None))
                    await self._store.put(step.record)
                    return step
                except PoolError as exc:
                    raise ActivatorError(f"the runtime could not snapshot sandbox {record.id}: {exc}") from exc
                self._telemetry.snapshot_bytes[info.kind] += info.image_bytes
                step = step._replace(record=replace(record, snapshot_kind=info.kind))
                await self._store.put(step.record)
            case "stop":
                await runtime_call(f"stop sandbox {record.id}", self._runtime.stop(record.id))
            case "freeze":
                await runtime_call(f"freeze sandbox {record.id}", self._runtime.freeze(record.id))
            case "thaw":
                await runtime_call(f"thaw sandbox {record.id}", self._runtime.thaw(record.id))
            case "set_egress":
                rules = record.egress.rules
                await runtime_call(f"set the egress of sandbox {record.id}", self._runtime.set_egress(record.id, rules))
        return step

    def freeze_only(self, record: SandboxRecord) -> bool:
        """Whether the sandbox is frozen where others are snapshotted: its template says so, or it mounts volumes
        (a memory image would not hold their mounts, and they are shared with other sandboxes)."""
        template = self._catalog.templates.get(record.template)
        return bool(record.volumes) or (template is not None and template.freeze_only)

    def spec_for(self, record: SandboxRecord) -> SandboxSpec:
        """What the runtime starts or restores the sandbox of `record` from; the caller's env vars win over the
        template's."""
        template = self._catalog.templates[record.template]
        init = ExecutorInit(
            env_vars={**template.env, **record.env_vars},
            access_token=record.access_token,
            default_user=template.user,
            default_workdir=template.workdir,
        )
        return SandboxSpec(
            sandbox_id=record.id, template=template, init=init, egress=record.egress.rules,
            annotations=_annotations(record), volumes=record.volumes,
        )  # fmt: skip

    def _remember(self, step: Step) -> None:
        record = step.record
        if step.log:
            crashed = record.crash is not None and step.before is not None and step.before.crash is None
            self._log(record.id, "error" if crashed else "info", step.log)
        if record.state is SandboxState.KILLED:
            self._live.pop(record.id, None)
            self._logs.drop(record.id)
        else:
            self._live[record.id] = record

    def _report(self, step: Step, intent: Intent, seconds: float) -> None:
        """The structured log line and the counters of one transition that did something."""
        before, after = step.before, step.record
        source = before.state.value if before else "none"
        kind = _kind(step)
        if step.action is not None:
            operation = _OPERATIONS.get(step.action)
            if operation is not None:
                self._telemetry.observe(operation, kind, seconds)
        if source == after.state.value:
            return
        self._telemetry.transitions[(source, after.state.value)] += 1
        extra = f" kind={kind}" if step.action in ("snapshot", "restore") else ""
        _log.info(
            "sandbox=%s transition=%s->%s reason=%s ms=%.1f%s",
            after.id, source, after.state.value, intent.reason, seconds * 1000, extra,
        )  # fmt: skip

    def _log(self, sandbox_id: str, level: LogLevel, message: str) -> None:
        self._logs.add(sandbox_id, LogLine(self._clock(), level, message))


def _annotations(record: SandboxRecord) -> dict[str, str]:
    """What a runtime may show of the sandbox on its own objects (the ReplicaSet on Kubernetes): who owns it (the
    API key's id, never a key), its metadata and lifecycle; never its env vars or tokens."""
    return {
        kube_shapes.OWNER_ANNOTATION: record.owner,
        kube_shapes.ALIAS_ANNOTATION: record.alias,
        kube_shapes.METADATA_ANNOTATION: _json(record.metadata).decode(),
        kube_shapes.LIFECYCLE_ANNOTATION: _json(record.lifecycle).decode(),
    }


_json = msgspec.json.Encoder().encode
_ABSENT_SECONDS = 1.0  # how long an id the store did not know is taken as unknown without asking again
_ABSENT_KEPT = 10_000  # at most this many such ids are remembered (then forgotten all at once)
_OPERATIONS = {"start": "cold_start", "thaw": "resume", "restore": "resume", "freeze": "pause", "snapshot": "snapshot"}


def _kind(step: Step) -> str:
    """The label of the step's latency: what was resumed from, or what a snapshot kept."""
    match step.action:
        case "thaw" | "freeze":
            return "frozen"
        case "restore" if not step.memory:
            return "filesystem"
        case "restore":
            return (step.before.snapshot_kind if step.before else None) or "unknown"
        case "snapshot":
            return step.record.snapshot_kind or "unknown"
    return "cold" if step.action == "start" else ""


async def runtime_call(what: str, work: Awaitable[T]) -> T:
    """Await a runtime call, turning the runtime's `PoolError`s into an `ActivatorError` (500) that says `what`."""
    try:
        return await work
    except PoolError as exc:
        raise ActivatorError(f"the runtime could not {what}: {exc}") from exc
