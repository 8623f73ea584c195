"""The background pass over live sandboxes: enforce timeouts, apply the idle policy, kill the sandboxes of keys
revoked longer than the grace period ago, purge old killed records.

An idle step is decided from a scan and re-checked under the sandbox's lock just before it happens (a guard):
traffic that came, an open that started, or a wake-up under way since the scan cancel it, so a request never
connects to a sandbox that freezes under it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from activator._activity import Activity
from activator._coordination import Coordinator
from activator._errors import ActivatorError, SandboxConflict, SandboxNotFound
from activator._idle import IdlePolicy
from activator._machine import Guard, SandboxMachine
from activator._opener import Opener
from activator._records import SandboxRecord, SandboxState
from activator._store import Store
from activator._transitions import Expire, Intent, Kill
from pool import PoolError, Runtime

__all__ = ["Reaper"]

_log = logging.getLogger("activator")
_Due = tuple[str, Intent, Guard | None]
# Seconds between two looks for revoked keys (one read of every key): a revoked key's sandboxes are killed within
# this long after its grace period ends.
REVOKED_SWEEP = 5.0


class Reaper:
    """Timeouts and the idle policy, one pass at a time (`reap_once`), every `interval` seconds (`run`)."""

    def __init__(
        self,
        machine: SandboxMachine,
        runtime: Runtime,
        store: Store,
        *,
        activity: Activity,
        opener: Opener,
        idle: IdlePolicy,
        clock: Callable[[], float],
        interval: float,
        killed_retention: float,
        revoked_grace: float,
        on_halt: Callable[[str], None] | None,
        coordinator: Coordinator,
    ) -> None:
        self._machine = machine
        self._runtime = runtime
        self._store = store
        self._activity = activity
        self._opener = opener
        self._idle = idle
        self._clock = clock
        self.interval = interval
        self._killed_retention = killed_retention
        self._revoked_grace = revoked_grace
        self._swept_at = -math.inf  # clock time of the last look for revoked keys (`_kill_revoked`)
        self._on_halt = on_halt
        self._coordinator = coordinator
        self._since = clock()  # activity is not persisted: after a restart every sandbox counts as active from here
        # id -> the frozen record whose snapshot would lose processes: a frozen sandbox's processes cannot change,
        # so the runtime is not asked again until the record changes. Written by the pass only.
        self._stays_frozen: dict[str, SandboxRecord] = {}

    async def run(self) -> None:
        """Call `reap_once` every `interval` seconds until cancelled (the platform's exit stack owns this task)."""
        while True:
            try:
                await self.reap_once()
            except ActivatorError:
                _log.exception("the reaper's pass failed")
            await asyncio.sleep(self.interval)

    async def reap_once(self) -> None:
        """Kill or pause sandboxes past their deadline, freeze or snapshot idle ones, purge old killed records."""
        if self._coordinator.shared:  # the traffic the other replicas saw counts too
            self._activity.merge(await self._coordinator.activity())
        now = self._clock()
        due: list[_Due] = []
        for record in self._machine.live.values():
            if not record.user_paused and record.end_at <= now:
                due.append((record.id, Expire(), None))
            elif (step := self._idle_step(record, now)) is not None:
                due.append(step)
        await asyncio.gather(*(self._apply(*item) for item in due))
        await self._kill_revoked(now)
        live = self._machine.live
        self._activity.prune(live.keys())
        self._stays_frozen = {i: r for i, r in self._stays_frozen.items() if live.get(i) is r}
        await self._store.purge_killed(now - self._killed_retention)

    async def _kill_revoked(self, now: float) -> None:
        """Kill the sandboxes of keys revoked `revoked_grace` seconds ago or more (every `REVOKED_SWEEP` seconds)."""
        if now - self._swept_at < REVOKED_SWEEP or not self._machine.live:
            return
        self._swept_at = now
        ended = {
            key.id for key in await self._store.keys()
            if key.revoked_at is not None and key.revoked_at + self._revoked_grace <= now
        }  # fmt: skip
        doomed = [record.id for record in self._machine.live.values() if record.owner in ended]
        await asyncio.gather(*(self._apply(sandbox_id, Kill("revoked"), None) for sandbox_id in doomed))

    def _idle_step(self, record: SandboxRecord, now: float) -> _Due | None:
        sandbox_id = record.id
        soonest = self._idle.soonest(record.template)
        if soonest is None or record.user_paused or record.state is SandboxState.SNAPSHOTTED:
            return None
        seen = self._activity.last(sandbox_id)
        idle_for = now - max(seen, record.started_at, self._since)
        if idle_for < soonest - self.interval:
            return None
        if self._busy(sandbox_id):
            # The gateway's idle keep-alive connections into it count as open: drop them a pass ahead, so that
            # by the threshold only real work (a request, a stream, a WebSocket) still keeps it busy.
            if self._on_halt is not None and record.state is SandboxState.RUNNING:
                self._on_halt(sandbox_id)
            return None
        if idle_for < soonest:
            return None
        intent = self._idle.due(record, idle_for, lambda: self._keeps_processes(record))
        if intent is None:
            return None
        return sandbox_id, intent, lambda: not self._busy(sandbox_id) and self._activity.last(sandbox_id) == seen

    def _busy(self, sandbox_id: str) -> bool:
        return self._activity.busy(sandbox_id) or self._opener.waking(sandbox_id)

    def _keeps_processes(self, record: SandboxRecord) -> bool:
        if self._stays_frozen.get(record.id) is record:
            return False
        try:
            keeps = self._runtime.snapshot_keeps_processes(record.id)
        except PoolError:  # it went away since the scan; the next pass sees the exit
            return False
        if not keeps and record.state is SandboxState.PAUSED:
            self._stays_frozen[record.id] = record
        return keeps

    async def _apply(self, sandbox_id: str, intent: Intent, guard: Guard | None) -> None:
        try:
            await self._machine.apply(sandbox_id, intent, guard=guard)
        except (SandboxNotFound, SandboxConflict):
            pass  # it was killed or paused by someone else since the scan: nothing left to do
        except ActivatorError as exc:
            _log.warning("sandbox %s: the reaper could not %s it: %s", sandbox_id, type(intent).__name__, exc)
