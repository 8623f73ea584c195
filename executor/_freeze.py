"""`/agent-sandbox/freeze` and `/agent-sandbox/thaw`: pausing the sandbox from inside, where no cgroup freezer is.

    POST /agent-sandbox/freeze   204  SIGSTOP every descendant of the executor
    POST /agent-sandbox/thaw     204  SIGCONT every descendant of the executor
    GET  /agent-sandbox/freeze   200  {"frozen": bool, "stopped": <processes stopped since the last thaw>}

Freezing walks the process tree again and again until one whole walk finds every descendant
stopped: a process that forked just before its SIGSTOP arrived leaves a child the previous walk did
not see, and only a process seen stopped can fork no more. A process is stopped only once its parent
is seen stopped, and thaw continues children before their parents: so a parent never sees a child
stop or continue (an interactive shell would otherwise mark its foreground job "Stopped" and take
the terminal back). At most `MAX_ROUNDS` walks; past that the answer is 500 and whatever was stopped
stays so (thaw, or freeze again). The executor itself and its threads keep running: /health, the API and
thaw still answer (the executor's own spawns finish their exec before the event loop runs a walk, so a
walk never meets a half-forked copy of the executor). Both calls are idempotent.

While frozen, the executor still starts processes when asked (process.Process/Start): they run,
they are not stopped, and thaw's SIGCONT does them no harm. Thaw continues every descendant, not only
the recorded ones, so nothing stays stopped, including a process a user stopped on purpose (`kill -STOP`).
Timeouts of processes (`Spec.timeout`) go on counting while frozen.
"""

from __future__ import annotations

import asyncio
import os
import signal

import msgspec

from executor._errors import Internal
from executor._exchange import Request, Response
from executor._proctree import STOPPED_STATES, descendants, send

__all__ = ("FreezeState", "Freezer")

JSON = "application/json"
MAX_ROUNDS = 100
FIRST_PAUSE = 0.001
MAX_PAUSE = 0.05
"""Between walks: FIRST_PAUSE after one that stopped a new process, else twice the last pause, up to MAX_PAUSE
(so a freeze gives up after about 5 s, within the 10 s a control-plane call may take)."""


class FreezeState(msgspec.Struct):
    """The body of `GET /agent-sandbox/freeze`."""

    frozen: bool
    stopped: int


_encode = msgspec.json.Encoder().encode


class Freezer:
    """Stops and continues the executor's descendants; remembers which pids it stopped."""

    def __init__(self) -> None:
        self._root = os.getpid()
        self._frozen = False
        self._stopped: set[int] = set()
        self._lock = asyncio.Lock()  # a freeze waits between walks: a thaw must not run in the middle of it

    def state(self) -> FreezeState:
        return FreezeState(self._frozen, len(self._stopped))

    async def freeze(self) -> None:
        """Stop every descendant, top-down, until a whole walk finds all of them stopped."""
        async with self._lock:
            self._frozen = True
            pause = FIRST_PAUSE
            for _ in range(MAX_ROUNDS):
                tree = descendants(self._root)
                stopped = {process.pid for process in tree if process.state in STOPPED_STATES}
                if len(stopped) == len(tree):
                    return
                ready = [p.pid for p in tree if p.pid not in stopped and (p.ppid == self._root or p.ppid in stopped)]
                for pid in ready:  # again for one signalled in the previous walk: SIGSTOP twice is harmless
                    send(pid, signal.SIGSTOP)
                pause = FIRST_PAUSE if not self._stopped.issuperset(ready) else min(pause * 2, MAX_PAUSE)
                self._stopped.update(ready)
                await asyncio.sleep(pause)
            running = [process.pid for process in tree if process.pid not in stopped]
            raise Internal(f"processes {running[:20]} did not stop after {MAX_ROUNDS} rounds; thaw or freeze again")

    async def thaw(self) -> None:
        """Continue every descendant, whoever stopped it, children first."""
        async with self._lock:
            for process in reversed(descendants(self._root)):
                send(process.pid, signal.SIGCONT)
            self._frozen = False
            self._stopped.clear()

    async def handle_freeze(self, request: Request, response: Response) -> None:
        if request.method == "GET":
            await response.send(200, _encode(self.state()), JSON)
            return
        try:
            await self.freeze()
        except Internal as exc:
            await response.send_error_json(exc)
            return
        await response.send(204)

    async def handle_thaw(self, request: Request, response: Response) -> None:
        await self.thaw()
        await response.send(204)
