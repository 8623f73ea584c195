"""One agent's process, speaking newline-delimited JSON-RPC on its stdin and stdout (ACP's stdio transport).

It is started through the executor's `ProcessTable`, so it runs as the sandbox's user in a process
group of its own, is reaped by the one Reaper and is killed with everything else at shutdown. Its
stderr is kept as a bounded tail for the error an exit reports. `stop()` answers within a second:
SIGTERM to the group and to every descendant that left it, SIGKILL for what is left after a grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable

from executor._processes import Exit, Output, Process, ProcessTable
from executor._proctree import alive, descendants, send
from executor._spawn import Spec

__all__ = ("MAX_LINE_BYTES", "STDERR_TAIL_BYTES", "AgentProcess")

logger = logging.getLogger("executor")

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The longest JSON-RPC message an agent may write; past it the agent is stopped (a runaway, not a message)."""
STDERR_TAIL_BYTES = 8 * 1024
STOP_GRACE_SECONDS = 0.5


class AgentProcess:
    """A started agent: `send()` writes one message; `on_message` gets each line it writes, `on_exit` its end."""

    def __init__(
        self,
        table: ProcessTable,
        spec: Spec,
        on_message: Callable[[bytes], None],
        on_exit: Callable[[Exit], None],
    ) -> None:
        self._process: Process = table.start(spec)
        self._subscription = self._process.subscribe()  # same loop step as the start: no output is missed
        self._on_message = on_message
        self._on_exit = on_exit
        self._partial = bytearray()
        self._stderr = bytearray()
        self.exit: Exit | None = None
        self._exited = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def stderr_tail(self) -> str:
        """At most the last `STDERR_TAIL_BYTES` the agent wrote to stderr, in whole lines: a secret is never cut in
        two, so the redactor finds it (a line longer than the tail is left out)."""
        tail = bytes(self._stderr[-STDERR_TAIL_BYTES:])
        if len(self._stderr) > STDERR_TAIL_BYTES:
            tail = tail.partition(b"\n")[2]
        return tail.decode("utf-8", "replace")

    async def send(self, line: bytes) -> None:
        """Write one message (a line of JSON) to the agent's stdin."""
        if self.exit is not None:
            raise ConnectionError("the agent process has exited")
        await self._process.write_input(line + b"\n", to_pty=False)

    async def stop(self) -> None:
        """End the agent and everything it started; returns once they have died (milliseconds; 1.5 s at most)."""
        if self.exit is None:
            self._signal_all(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited.wait(), STOP_GRACE_SECONDS)
        killed = self._tree()
        self._signal_all(signal.SIGKILL)  # its descendants too, even once the agent itself is gone
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited.wait(), STOP_GRACE_SECONDS)
        for _ in range(round(STOP_GRACE_SECONDS / 0.01)):  # SIGKILL is not instant: wait until they have died
            if not any(alive(pid) for pid in killed):  # (no event tells of a grandchild's death)
                break
            await asyncio.sleep(0.01)

    def _signal_all(self, number: int) -> None:
        if self.exit is None:
            self._process.signal(number)
        for pid in self._tree():
            send(pid, number)

    def _tree(self) -> set[int]:
        """The agent's descendants, and what is left of its process group (a child whose parent died)."""
        below = {process.pid for process in descendants(self.pid)}
        return below | {process.pid for process in descendants(os.getpid()) if _group(process.pid) == self.pid}

    async def _read(self) -> None:
        while True:
            item = await self._subscription.next()
            if isinstance(item, Exit):
                self._finish(item)
                return
            self._take(item)

    def _take(self, output: Output) -> None:
        if output.stream == "stderr":
            self._stderr += output.data
            del self._stderr[: -2 * STDERR_TAIL_BYTES]  # twice the tail: what is cut is a whole line, below
            return
        if b"\n" not in output.data:  # the line goes on: no split of what came before (long lines stay linear)
            self._partial += output.data
        else:
            head, *middle, rest = output.data.split(b"\n")
            lines = [bytes(self._partial + head), *middle]
            self._partial = bytearray(rest)
            for line in lines:
                if line.strip():
                    try:
                        self._on_message(line.strip())
                    except Exception:  # one message nobody could handle must not stop the reading
                        logger.exception("agent %d: a message could not be handled", self.pid)
        if len(self._partial) > MAX_LINE_BYTES:
            logger.warning("agent %d wrote a line longer than %d bytes: stopping it", self.pid, MAX_LINE_BYTES)
            self._partial.clear()
            self._process.signal(signal.SIGKILL)

    def _finish(self, end: Exit) -> None:
        self._subscription.close()
        self.exit = end
        self._exited.set()
        self._on_exit(end)


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
