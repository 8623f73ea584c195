"""Reaping the zombies that reach us as a child subreaper.

When a sandbox is killed, its pid 1 and the processes still in its pid namespace may outlive their parent
(the outer bubblewrap) for an instant and are re-parented to us. Only those are reaped here, recognised by
their host uid, which lies in the sandbox's own id range: our other children (bubblewrap, criu, the
`Popen`s of this process) run as host root, and reaping them here would steal their exit status.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["reap_orphans"]


def _zombie_children() -> list[tuple[int, int]]:
    """(pid, uid) of our children that have exited."""
    me, found = os.getpid(), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            if state != "Z" or int(ppid) != me:
                continue
            found.append((int(entry), os.stat(f"/proc/{entry}").st_uid))
        except OSError:  # gone meanwhile
            continue
    return found


def reap_orphans(uids: range) -> int:
    """Reap exited children whose host uid is in `uids` (a sandbox's id range); returns how many."""
    reaped = 0
    for pid, uid in _zombie_children():
        if uid in uids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
                reaped += 1
    return reaped
