"""The one place that waits for children.

The executor is pid 1 of its sandbox (or a child subreaper), so every process that dies in the
sandbox becomes its child and must be reaped, or it stays a zombie. One SIGCHLD handler runs a
`waitpid(-1, WNOHANG)` loop: statuses of processes someone is watching go to that watcher, the
rest (orphans) are dropped. Nothing else may call wait*(): that is why processes are spawned with
`subprocess.Popen` but never polled, and asyncio's child watchers are never used.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

__all__ = ("Reaper",)

logger = logging.getLogger("executor")


class Reaper:
    """Reaps every child; tells watchers the wait status of the ones they registered."""

    def __init__(self) -> None:
        # pid -> callback; filled by whoever spawns, in the same loop step as the fork, so a
        # SIGCHLD (handled later, as a loop callback) can never arrive before the registration.
        self._watchers: dict[int, Callable[[int], None]] = {}

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reaping on SIGCHLD, and reap whatever already exited."""
        loop.add_signal_handler(signal.SIGCHLD, self.reap)
        self.reap()

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        """Call `on_exit(wait_status)` when `pid` is reaped."""
        self._watchers[pid] = on_exit

    def reap(self) -> None:
        """Collect every child that has exited so far."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            on_exit = self._watchers.pop(pid, None)
            if on_exit is None:
                continue
            try:
                on_exit(status)
            except Exception:
                logger.exception("exit callback for pid %d failed", pid)
