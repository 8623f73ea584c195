"""Reaping the zombies that reach us as a child subreaper.

When a sandbox is killed, its pid 1 and the processes still in its pid namespace may outlive their parent
(the outer bubblewrap) for an instant and are re-parented to us. Only those are reaped here, recognised by
their host uid, which lies in the sandbox's own id range: our other children (bubblewrap, criu, the
`Popen`s of this process) run as host root, and reaping them here would steal their exit status.
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["reap_orphans"]


def _processes_in(uids: range) -> list[tuple[int, bool]]:
    """(pid, whether it is our exited child) of every process whose host uid is in `uids`."""
    me, found = os.getpid(), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{entry}").st_uid not in uids:
                continue
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            found.append((int(entry), state == "Z" and int(ppid) == me))
        except OSError:  # gone meanwhile
            continue
    return found


def reap_orphans(uids: range, timeout: float = 5.0) -> bool:
    """Reap our exited children whose host uid is in `uids` (a sandbox's id range) until no process of that
    range is left, or `timeout` passes; returns whether none is left.

    A killed sandbox's cgroup empties before its processes finish exiting (a task leaves its cgroup first, and
    becomes a zombie after), so one pass could find a re-parented pid 1 still exiting and leave its zombie
    behind, in a range the slot's next sandbox gets.
    """
    deadline, pause = time.monotonic() + timeout, 0.0005
    while found := _processes_in(uids):
        for pid, reapable in found:
            if reapable:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.05)  # each pass reads all of /proc: a process that lingers is not polled hot
    return True
