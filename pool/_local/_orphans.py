"""Reaping the zombies that reach us as a child subreaper.

When a sandbox is killed, its pid 1 and the processes still in its pid namespace may outlive their parent
(the outer bubblewrap) for an instant and are re-parented to us. Only those are reaped here: children we
started ourselves are waited for by their `Popen`, and reaping them here would steal their exit status.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection

__all__ = ["reap_orphans"]


def _zombie_children() -> list[int]:
    me, found = os.getpid(), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:  # gone meanwhile
            continue
        if state == "Z" and int(ppid) == me:
            found.append(int(entry))
    return found


def reap_orphans(owned: Collection[int]) -> int:
    """Reap zombie children whose pid is not in `owned`; returns how many."""
    reaped = 0
    for pid in _zombie_children():
        if pid not in owned:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
                reaped += 1
    return reaped
