"""Per-sandbox lifecycle logs: what the control plane did to a sandbox and when, for E2B's logs endpoints.

What is there: "created from template <name>", "paused (api|timeout|idle)", "resumed with <n> s to live",
"killed ..." (on request, timeout, or processes gone after a restart), and the message of every runtime action
that failed (level `error`). Not there (yet): the output of the sandbox's own processes.

Kept in memory only, in a bounded ring per live sandbox: they are lost on restart and dropped with the sandbox.
Each line is also written to the server's own log (logger `activator`).
"""

from __future__ import annotations

import collections
import logging
from typing import Literal, NamedTuple, get_args

__all__ = ["LOG_LEVELS", "LogLevel", "LogLine", "SandboxLogs"]

LogLevel = Literal["debug", "info", "warn", "error"]
LOG_LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)  # lowest first

_log = logging.getLogger("activator")
_PY_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}


class LogLine(NamedTuple):
    """One lifecycle event of one sandbox."""

    timestamp: float  # unix seconds
    level: LogLevel
    message: str


class SandboxLogs:
    """The last `max_lines` lifecycle lines of every live sandbox."""

    def __init__(self, max_lines: int) -> None:
        self._max_lines = max_lines
        # sandbox id -> its ring; written by the activator's transitions on the event loop
        self._rings: dict[str, collections.deque[LogLine]] = {}

    def add(self, sandbox_id: str, line: LogLine) -> None:
        """Append a line (the oldest falls out once the ring is full)."""
        ring = self._rings.setdefault(sandbox_id, collections.deque(maxlen=self._max_lines))
        ring.append(line)
        _log.log(_PY_LEVELS[line.level], "sandbox %s: %s", sandbox_id, line.message)

    def lines(self, sandbox_id: str) -> list[LogLine]:
        """The sandbox's lines, oldest first."""
        return list(self._rings.get(sandbox_id, ()))

    def drop(self, sandbox_id: str) -> None:
        """Forget a sandbox's lines."""
        self._rings.pop(sandbox_id, None)
