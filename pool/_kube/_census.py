"""Whether a sandbox runs only the template's own processes, as its executor lists them (envd's Process/List).

The idle policy snapshots only a sandbox whose snapshot loses nothing a restore cannot start again: the
template's start commands (tagged `template-start-<n>`) and the sandbox's autostart command (tagged
`agent-sandbox-autostart`, or started with `AGENT_SANDBOX_AUTOSTART=1`). `Runtime.snapshot_keeps_processes` is
synchronous, so answers are cached: taken fresh by `freeze` (nothing changes while frozen), otherwise
refreshed in the background once older than `max_age` (False until the first one is in: the careful answer).

Blind spot: the executor lists the processes it started and that still run. A process one of them left
behind (`cmd &` in a command that has ended) is not listed, and a snapshot loses it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable

from executor.envd import ProcessInfo
from pool._autostart import AUTOSTART_ENV, AUTOSTART_TAG
from pool._errors import PoolError
from pool._executor_client import list_processes
from pool._template_start import START_TAG

__all__ = ["ProcessCensus", "template_only"]

_log = logging.getLogger("pool.kubernetes")


async def template_only(sock: socket.socket, token: str | None) -> bool:
    """Whether every process the executor lists is the template's own (start commands, autostart)."""
    return all(_own(process) for process in await list_processes(sock, token))


def _own(process: ProcessInfo) -> bool:
    tag = process.tag or ""
    return tag.startswith(START_TAG) or tag == AUTOSTART_TAG or process.config.envs.get(AUTOSTART_ENV) == "1"


class ProcessCensus:
    """The last answer per sandbox, with its age; refreshes run as tasks of their own, one per sandbox."""

    def __init__(self, *, max_age: float) -> None:
        self._max_age = max_age
        # sandbox id -> (monotonic time taken, or None: valid until forgotten; answer). Written on the loop.
        self._answers: dict[str, tuple[float | None, bool]] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    def answer(self, sandbox_id: str, take: Callable[[], Awaitable[bool]]) -> bool:
        """The cached answer (False when there is none); starts a refresh with `take` when it is stale."""
        taken, keeps = self._answers.get(sandbox_id, (0.0, False))
        stale = taken is not None and time.monotonic() - taken > self._max_age
        if stale and sandbox_id not in self._refreshing:
            task = asyncio.get_running_loop().create_task(self._refresh(sandbox_id, take))
            self._refreshing[sandbox_id] = task
            task.add_done_callback(lambda _: self._refreshing.pop(sandbox_id, None))
        return keeps

    def set(self, sandbox_id: str, keeps: bool, *, until_forgotten: bool = False) -> None:
        self._answers[sandbox_id] = (None if until_forgotten else time.monotonic(), keeps)

    def forget(self, sandbox_id: str) -> None:
        self._answers.pop(sandbox_id, None)

    async def close(self) -> None:
        for task in list(self._refreshing.values()):
            task.cancel()
        await asyncio.gather(*self._refreshing.values(), return_exceptions=True)

    async def _refresh(self, sandbox_id: str, take: Callable[[], Awaitable[bool]]) -> None:
        try:
            keeps = await take()
        except PoolError as exc:
            _log.info("sandbox %s: its processes could not be listed: %s", sandbox_id, exc)
            return
        if self._answers.get(sandbox_id, (0.0, False))[0] is not None:  # a freeze's answer wins
            self.set(sandbox_id, keeps)
