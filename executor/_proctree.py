"""The executor's descendant processes, read from /proc, and signalling them.

A process is a descendant when following ppids from it reaches the executor. The whole of /proc is
read each time (every `/proc/<pid>/stat`), since `/proc/<pid>/task/<tid>/children` is optional and
racy. Threads of the executor are not processes in /proc's listing, so they never appear here.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from dataclasses import dataclass

__all__ = ("STOPPED_STATES", "Descendant", "alive", "descendants", "send")

STOPPED_STATES = frozenset("TtZX")
"""States in which a process can no longer run or fork: stopped, traced-stopped, zombie, dead."""


@dataclass(frozen=True)
class Descendant:
    """A process below the executor: its state letter from /proc/<pid>/stat ("R", "S", "T", …) and its parent."""

    pid: int
    state: str
    ppid: int


def descendants(root: int) -> list[Descendant]:
    """Every process below `root`, parents before their children (breadth first)."""
    children: dict[int, list[Descendant]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (process := _stat(int(name))) is not None:
            children.setdefault(process.ppid, []).append(process)
    found: list[Descendant] = []
    queue = deque(children.get(root, ()))
    while queue:
        process = queue.popleft()
        found.append(process)
        queue.extend(children.get(process.pid, ()))
    return found


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie has ended: only its exit status is left to reap)."""
    process = _stat(pid)
    return process is not None and process.state not in ("Z", "X")


def send(pid: int, number: int) -> None:
    """Signal one process; one that is already gone is no error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


def _stat(pid: int) -> Descendant | None:
    """What /proc/<pid>/stat says, or None when the process vanished meanwhile.

    The line is `pid (comm) state ppid …`, and comm may hold spaces and parentheses: split after the last ")".
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            line = file.read()
    except OSError:
        return None
    fields = line[line.rfind(b")") + 2 :].split(b" ", 2)
    return Descendant(pid, fields[0].decode("ascii"), int(fields[1]))
