"""Carries out the plans of `_transitions`: one transition at a time per sandbox, stored before acknowledged.

Order inside a transition: plan -> store the new record -> runtime action -> update the in-memory route cache.
Storing the intent first means a crash mid-transition leaves a record that `recover` can finish (`Reassert`
freezes a record stored as paused, thaws one stored as running, kills one whose processes are gone). When the
runtime action fails, the previous record is stored again and the error goes to the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from msgspec.structs import replace

from activator._catalog import TemplateCatalog
from activator._errors import ActivatorError
from activator._logs import LogLevel, LogLine, SandboxLogs
from activator._records import SandboxRecord, SandboxState
from activator._store import Store
from activator._transitions import Intent, Kill, Reassert, Step, plan
from pool import ExecutorInit, PoolError, Runtime, SandboxSpec

__all__ = ["SandboxMachine", "runtime_call"]

T = TypeVar("T")
_log = logging.getLogger("activator")


class SandboxMachine:
    """Serializes, stores and performs every sandbox transition, and mirrors live records in memory."""

    def __init__(
        self,
        store: Store,
        runtime: Runtime,
        catalog: TemplateCatalog,
        logs: SandboxLogs,
        *,
        clock: Callable[[], float] = time.time,
        on_halt: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._runtime = runtime
        self._catalog = catalog
        self._logs = logs
        self._clock = clock
        self._on_halt = on_halt
        # The route cache: id -> current record of every sandbox that is not killed. Written only by `apply`
        # (under that sandbox's lock) and `recover`, so a reader on the event loop sees whole transitions.
        self._live: dict[str, SandboxRecord] = {}
        # One lock per sandbox id, guarding the plan -> store -> act -> cache sequence of its transitions. Weak
        # values: a lock disappears once no transition holds or awaits it, so the dict stays as small as the work.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @property
    def live(self) -> Mapping[str, SandboxRecord]:
        """The current record of every sandbox that is not killed (read-only view of the route cache)."""
        return self._live

    async def apply(self, sandbox_id: str, intent: Intent) -> Step:
        """Carry out `intent` on the sandbox; returns what was done. Raises what `plan` or the runtime raise."""
        async with self._lock(sandbox_id):
            before = self._live.get(sandbox_id)
            step = plan(before, intent, self._clock())
            if step.action is None and step.record == before:
                return step
            await self._store.put(step.record)
            if step.action is not None:
                await self._act_or_undo(before, step)
            self._remember(step)
            return step

    async def recover(self) -> None:
        """After a restart: load the stored live records and reconcile them with the runtime's sandboxes."""
        alive = await runtime_call("recover its sandboxes", self._runtime.recover())
        records = await self._store.live()
        self._live.update((record.id, record) for record in records)
        for record in records:
            intent = Reassert() if record.id in alive else Kill("its processes were gone after a restart")
            await self._recover_one(record.id, self.apply(record.id, intent))
        for orphan in alive - self._live.keys():
            _log.warning("sandbox %s: stopping its processes, which have no record", orphan)
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

    async def _act_or_undo(self, before: SandboxRecord | None, step: Step) -> None:
        try:
            await self._act(step)
        except Exception as exc:  # undo for any failure, then let it go on to the caller unchanged
            await self._store.put(before or replace(step.record, state=SandboxState.KILLED))
            self._log(step.record.id, "error", str(exc))
            raise

    async def _act(self, step: Step) -> None:
        sandbox_id = step.record.id
        match step.action:
            case "start":
                work = self._runtime.start(self._spec(step.record))
            case "stop":
                work = self._runtime.stop(sandbox_id)
            case "freeze":
                work = self._runtime.freeze(sandbox_id)
            case "thaw":
                work = self._runtime.thaw(sandbox_id)
            case None:
                return
        await runtime_call(f"{step.action} sandbox {sandbox_id}", work)

    def _spec(self, record: SandboxRecord) -> SandboxSpec:
        template = self._catalog.templates[record.template]
        init = ExecutorInit(
            env_vars=record.env_vars,
            access_token=record.access_token,
            default_user=template.user,
            default_workdir=template.workdir,
        )
        return SandboxSpec(sandbox_id=record.id, template=template, init=init)

    def _remember(self, step: Step) -> None:
        record = step.record
        if step.log:
            self._log(record.id, "info", step.log)
        if record.state is SandboxState.KILLED:
            self._live.pop(record.id, None)
            self._logs.drop(record.id)
        else:
            self._live[record.id] = record
        if record.state is not SandboxState.RUNNING and step.action is not None and self._on_halt:
            self._on_halt(record.id)

    def _log(self, sandbox_id: str, level: LogLevel, message: str) -> None:
        self._logs.add(sandbox_id, LogLine(self._clock(), level, message))


async def runtime_call(what: str, work: Awaitable[T]) -> T:
    """Await a runtime call, turning the runtime's `PoolError`s into an `ActivatorError` (500) that says `what`."""
    try:
        return await work
    except PoolError as exc:
        raise ActivatorError(f"the runtime could not {what}: {exc}") from exc
