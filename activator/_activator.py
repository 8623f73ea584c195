"""The activator: the lifecycle operations of the control plane, the gateway's opener, and the reaper.

Every operation that changes a sandbox is one `Intent` handed to the `SandboxMachine`, which serializes it per
sandbox and stores it before it answers; this module adds ownership, TTL bounds, listing, single-flight
wake-ups for data-plane traffic and the background loop that enforces timeouts and the idle policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable, Collection, Mapping
from typing import Literal, NamedTuple

from activator._catalog import TemplateCatalog
from activator._errors import ActivatorError, InvalidRequest, PortNotOpen, SandboxConflict, SandboxNotFound
from activator._holds import HoldGate
from activator._logs import LogLine, SandboxLogs
from activator._machine import SandboxMachine, runtime_call
from activator._records import CreateRequest, SandboxRecord, SandboxState, new_access_token, new_sandbox_id
from activator._settings import ActivatorSettings
from activator._store import Store, decode_cursor, encode_cursor
from activator._transitions import Expire, Intent, Kill, Pause, Resume, SetTimeout, Start, Step
from pool import PoolError, PortClosed, Runtime, SandboxGone, SandboxStats, Template

__all__ = ["Activator", "Page"]

_log = logging.getLogger("activator")
_LISTED = (SandboxState.RUNNING, SandboxState.PAUSED)


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
    ) -> None:
        """`on_halt(sandbox_id)` runs after a sandbox was paused or killed (e.g. the gateway's `pool.drop`)."""
        self.settings = settings
        self.catalog = TemplateCatalog(templates, settings.template_aliases, loaded_at=clock())
        self._store = store
        self._runtime = runtime
        self._clock = clock
        self._logs = SandboxLogs(settings.log_lines)
        self._machine = SandboxMachine(store, runtime, self.catalog, self._logs, clock=clock, on_halt=on_halt)
        self._holds = HoldGate(max_held=settings.max_held, deadline=settings.hold_deadline)
        # id -> clock time of the last proxied request; written by `touch` (gateway, per request, memory only),
        # read and pruned by the reaper's idle check.
        self._activity: dict[str, float] = {}
        # id -> the resume started for data-plane traffic; every request held for that sandbox awaits the same
        # task (single flight). Added by `_wake`, removed by the task's done callback.
        self._waking: dict[str, asyncio.Task[Step]] = {}

    async def recover(self) -> None:
        """Reconcile the stored records with the runtime after a restart; call once before serving."""
        await self._machine.recover()

    async def sandbox_exited(self, sandbox_id: str) -> None:
        """The runtime saw the sandbox's processes end on their own (a crash, or its pid 1 exited): record it."""
        with contextlib.suppress(SandboxNotFound, SandboxConflict):  # killed by a request or the reaper meanwhile
            await self._machine.apply(sandbox_id, Kill())

    async def kill_all(self) -> int:
        """Kill every sandbox of every key (the operator's `agent-sandbox cleanup`); returns how many there were."""
        ids = list(self._machine.live)
        await asyncio.gather(*(self._reap(sandbox_id, Kill()) for sandbox_id in ids))
        return len(ids)

    async def create(self, owner: str, request: CreateRequest) -> SandboxRecord:
        """Start a sandbox from `request.template` (a name or an alias) for the API key `owner`."""
        template = self.catalog.resolve(request.template)
        timeout, now = self._ttl(request.timeout), self._clock()
        record = SandboxRecord(
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
            cpu_count=template.resources.cpu_count,
            memory_mb=template.resources.memory_mb,
            disk_mb=template.resources.disk_mb,
            client_id=self.settings.client_id,
            envd_version=self.settings.envd_version,
            domain=self.settings.domain,
        )
        return (await self._machine.apply(record.id, Start(record))).record

    def get(self, owner: str, sandbox_id: str) -> SandboxRecord:
        """The sandbox's current record; SandboxNotFound if it is killed, unknown, or another key's."""
        record = self._machine.live.get(sandbox_id)
        if record is None or record.owner != owner:
            raise SandboxNotFound(f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")
        return record

    async def kill(self, owner: str, sandbox_id: str) -> None:
        """Kill the sandbox; a second kill finds nothing (SandboxNotFound)."""
        await self._owned(owner, sandbox_id, Kill())

    async def set_timeout(self, owner: str, sandbox_id: str, seconds: float) -> None:
        """Make the sandbox expire `seconds` from now (of running time, if it is paused)."""
        await self._owned(owner, sandbox_id, SetTimeout(self._ttl(seconds)))

    async def refresh(self, owner: str, sandbox_id: str, seconds: float) -> None:
        """Keep the sandbox alive for at least `seconds` more."""
        await self._owned(owner, sandbox_id, SetTimeout(self._ttl(seconds), extend_only=True))

    async def pause(self, owner: str, sandbox_id: str) -> None:
        """Freeze the sandbox and stop its TTL; SandboxConflict if it is already paused."""
        await self._owned(owner, sandbox_id, Pause())

    async def connect(self, owner: str, sandbox_id: str, seconds: float) -> tuple[SandboxRecord, bool]:
        """Resume the sandbox if it is paused and lengthen its TTL to `seconds`; True when it was resumed."""
        step = await self._owned(owner, sandbox_id, Resume(self._ttl(seconds)))
        return step.record, step.action == "thaw"

    async def resume(self, owner: str, sandbox_id: str, seconds: float) -> SandboxRecord:
        """Resume a paused sandbox with a TTL of at least `seconds`; SandboxConflict if it runs (E2B's v1 resume)."""
        return (await self._owned(owner, sandbox_id, Resume(self._ttl(seconds), only_if_paused=True))).record

    async def metrics(self, owner: str, sandbox_id: str) -> tuple[float, SandboxStats]:
        """The sandbox's current resource use, and when it was read."""
        self.get(owner, sandbox_id)
        stats = await runtime_call(f"read the stats of {sandbox_id}", self._runtime.stats(sandbox_id))
        return self._clock(), stats

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
        started_after: float | None = None,
        limit: int = 100,
        next_token: str | None = None,
        order: Literal["asc", "desc"] = "desc",
    ) -> Page:
        """`owner`'s sandboxes in `states` whose metadata contain `metadata`, by creation time, a page at a time."""
        if not 1 <= limit <= 100:
            raise InvalidRequest(f"limit must be between 1 and 100, not {limit}")
        wanted = dict(metadata or {})

        def keep(record: SandboxRecord) -> bool:
            return (
                wanted.items() <= record.metadata.items()
                and template in (None, record.template, record.alias)
                and (started_after is None or record.started_at >= started_after)
            )

        after = decode_cursor(next_token) if next_token else None
        found = await self._store.page(owner, states, order=order, after=after, count=limit + 1, keep=keep)
        more = len(found) > limit
        return Page(found[:limit], encode_cursor(found[limit - 1]) if more else None)

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected socket to `port` in the sandbox, resuming it first when traffic may wake it.

        The gateway's opener. Traffic wakes a sandbox paused by the idle policy, or one whose lifecycle has
        auto-resume. SandboxNotFound: unknown, killed, or paused and not woken by traffic (E2B's proxy answers all
        three with 502 "...was not found"); PortNotOpen: nothing accepts on the port; HoldQueueFull and
        HoldTimeout: too many requests wait already, or the resume took too long.
        """
        record = self._machine.live.get(sandbox_id)
        if record is None:
            raise SandboxNotFound(f"The sandbox was not found: {sandbox_id}")
        if record.state is not SandboxState.RUNNING:
            if not (record.lifecycle.auto_resume or record.pause_reason == "idle"):
                raise SandboxNotFound(f"The sandbox was not found: {sandbox_id} is paused and does not auto-resume")
            await self._holds.hold(asyncio.shield(self._wake(record)))
        try:
            return await self._runtime.open_socket(sandbox_id, port)
        except PortClosed as exc:
            raise PortNotOpen(f"The sandbox is running but port is not open: {port}") from exc
        except SandboxGone as exc:
            raise SandboxNotFound(f"The sandbox was not found: {sandbox_id} has no processes") from exc
        except PoolError as exc:
            raise ActivatorError(f"cannot reach port {port} of sandbox {sandbox_id}: {exc}") from exc

    def touch(self, sandbox_id: str) -> None:
        """Note traffic to the sandbox for the idle policy: a timestamp in memory, never a store write."""
        if sandbox_id in self._machine.live:
            self._activity[sandbox_id] = self._clock()

    async def run_reaper(self) -> None:
        """Call `reap_once` every `reap_interval` seconds until cancelled (the app's lifespan owns this task)."""
        while True:
            try:
                await self.reap_once()
            except ActivatorError:
                _log.exception("the reaper's pass failed")
            await asyncio.sleep(self.settings.reap_interval)

    async def reap_once(self) -> None:
        """Kill or pause running sandboxes past their deadline, pause idle ones, purge old killed records."""
        now = self._clock()
        due: list[tuple[str, Intent]] = []
        for record in self._machine.live.values():
            if record.state is SandboxState.RUNNING and record.end_at <= now:
                due.append((record.id, Expire()))
            elif record.state is SandboxState.RUNNING and self._idle(record, now):
                due.append((record.id, Pause("idle")))
        await asyncio.gather(*(self._reap(sandbox_id, intent) for sandbox_id, intent in due))
        self._activity = {i: t for i, t in self._activity.items() if i in self._machine.live}
        await self._store.purge_killed(now - self.settings.killed_retention)

    async def _reap(self, sandbox_id: str, intent: Intent) -> None:
        try:
            await self._machine.apply(sandbox_id, intent)
        except (SandboxNotFound, SandboxConflict):
            pass  # it was killed or paused by someone else since the scan: nothing left to do
        except ActivatorError as exc:
            _log.warning("sandbox %s: the reaper could not %s it: %s", sandbox_id, type(intent).__name__, exc)

    def _idle(self, record: SandboxRecord, now: float) -> bool:
        template = self.catalog.templates.get(record.template)
        if template is None or template.pause_after is None:
            return False
        last = max(self._activity.get(record.id, 0.0), record.started_at)
        return now - last > template.pause_after

    def _wake(self, record: SandboxRecord) -> asyncio.Task[Step]:
        task = self._waking.get(record.id)
        if task is None:
            task = asyncio.create_task(self._machine.apply(record.id, Resume(record.timeout)))
            self._waking[record.id] = task
            task.add_done_callback(functools.partial(self._woken, record.id))
        return task

    def _woken(self, sandbox_id: str, task: asyncio.Task[Step]) -> None:
        del self._waking[sandbox_id]
        if not task.cancelled():
            task.exception()  # mark it retrieved: every waiter may have given up (HoldTimeout) before it ended

    async def _owned(self, owner: str, sandbox_id: str, intent: Intent) -> Step:
        self.get(owner, sandbox_id)  # owners never change, so checking outside the sandbox's lock is safe
        return await self._machine.apply(sandbox_id, intent)

    def _ttl(self, seconds: float) -> float:
        if not 0 <= seconds <= self.settings.max_timeout:
            raise InvalidRequest(f"Timeout must be between 0 and {self.settings.max_timeout} seconds, not {seconds}")
        return float(seconds)
