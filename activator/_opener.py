"""The gateway's way into sandboxes: a connected socket, after waking the sandbox when traffic may wake it.

Single flight: the first request for a sandbox that is not running starts one `Wake` transition; every request
that arrives meanwhile awaits that same task, held by the `HoldGate` (capped, with a deadline, released when
its client leaves). A frozen sandbox is thawed before anything connects to it: a frozen server's listen
backlog is small and what does not fit waits for SYN retransmits (seconds).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import socket
import time

from activator._activity import Activity
from activator._errors import ActivatorError, PortNotOpen, SandboxNotFound
from activator._holds import HoldGate
from activator._machine import SandboxMachine
from activator._records import SandboxState
from activator._telemetry import Telemetry
from activator._transitions import Step, Wake
from pool import PoolError, PortClosed, Runtime, SandboxGone

__all__ = ["Opener"]


class Opener:
    """`open_upstream` / `ensure_running` / `touch`: what the data plane asks of the lifecycle layer."""

    def __init__(
        self, machine: SandboxMachine, runtime: Runtime, activity: Activity, holds: HoldGate, telemetry: Telemetry
    ) -> None:
        self._machine = machine
        self._runtime = runtime
        self._activity = activity
        self._holds = holds
        self._telemetry = telemetry
        # id -> the wake-up under way for data-plane traffic; every request held for that sandbox awaits the same
        # task (single flight). Added by `_wake`, removed by the task's done callback.
        self._waking: dict[str, asyncio.Task[Step]] = {}

    def waking(self, sandbox_id: str) -> bool:
        return sandbox_id in self._waking

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected socket to `port` in the sandbox, woken first when needed (see `ensure_running`).

        PortNotOpen: nothing accepts on the port; SandboxNotFound: the sandbox vanished meanwhile.
        """
        with self._activity.opening(sandbox_id):  # the idle policy leaves the sandbox alone meanwhile
            await self.ensure_running(sandbox_id)
            try:
                sock = await self._connect(sandbox_id, port)
            except SandboxNotFound:
                if not self._machine.shared:
                    raise
                # Another replica may have scaled it to zero a moment ago, before its notice reached this one.
                await self._machine.reread(sandbox_id)
                await self.ensure_running(sandbox_id)
                sock = await self._connect(sandbox_id, port)
            self._activity.opened(sandbox_id, sock)
            return sock

    async def ensure_running(self, sandbox_id: str) -> None:
        """Return once the sandbox runs, resuming it (single flight) when traffic may wake it.

        SandboxNotFound: unknown, killed, or paused without auto-resume (E2B's proxy answers all three with 502
        "...was not found"); HoldQueueFull, HoldTimeout, ClientGone: from the hold.
        """
        record = await self._machine.load(sandbox_id)
        if record is None:
            raise SandboxNotFound(f"The sandbox was not found: {sandbox_id}")
        if record.state is SandboxState.RUNNING and not self._machine.leaving(sandbox_id):
            return
        if not record.wakes_on_traffic:
            raise SandboxNotFound(f"The sandbox was not found: {sandbox_id} is paused and does not auto-resume")
        await self._holds.hold(self._wake(sandbox_id))

    def touch(self, sandbox_id: str) -> None:
        """Note traffic to the sandbox for the idle policy: a timestamp in memory, never a store write."""
        if sandbox_id in self._machine.live:
            self._activity.touch(sandbox_id)

    async def _connect(self, sandbox_id: str, port: int) -> socket.socket:
        try:
            return await self._runtime.open_socket(sandbox_id, port)
        except PortClosed as exc:
            raise PortNotOpen(f"The sandbox is running but port is not open: {port}") from exc
        except SandboxGone as exc:
            raise SandboxNotFound(f"The sandbox was not found: {sandbox_id} has no processes") from exc
        except PoolError as exc:
            raise ActivatorError(f"cannot reach port {port} of sandbox {sandbox_id}: {exc}") from exc

    def _wake(self, sandbox_id: str) -> asyncio.Task[Step]:
        task = self._waking.get(sandbox_id)
        if task is None:
            # A fresh context: the wake-up serves every held request, not the one whose context started it.
            task = asyncio.create_task(self._machine.apply(sandbox_id, Wake()), context=contextvars.Context())
            self._waking[sandbox_id] = task
            task.add_done_callback(functools.partial(self._woken, sandbox_id, time.perf_counter()))
        return task

    def _woken(self, sandbox_id: str, began: float, task: asyncio.Task[Step]) -> None:
        del self._waking[sandbox_id]
        if task.cancelled() or task.exception() is not None:  # retrieved: every waiter may have left already
            self._telemetry.activations["error"] += 1
            return
        self._activity.touch(sandbox_id)  # woken now: the idle clock starts again
        step = task.result()
        before = step.before
        if step.action is not None and before is not None:
            kind = "frozen" if before.state is SandboxState.PAUSED else before.snapshot_kind or "unknown"
            self._telemetry.activations["ok"] += 1
            self._telemetry.observe("activation", kind, time.perf_counter() - began)
