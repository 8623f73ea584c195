"""Every process of a container, found and killed through a cgroup of its own (cgroup v2, no controllers).

A container's main process may start children that leave its process group or outlive it (the executor
starts the sandbox's processes in sessions of their own), so a process group is not enough to leave nothing
behind. Membership in a cgroup v2 directory is inherited by every descendant and cannot be left without
root, and `cgroup.kill` ends them all at once. Hosts without a cgroup2 mount fall back to the process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["ProcessTracker"]


def _cgroup2_mount() -> Path | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[0] == "cgroup2":
                return Path(left.split()[4])
    return None


class ProcessTracker:
    """Creates, kills and removes per-container cgroups under one parent cgroup of the cluster."""

    def __init__(self, parent_name: str) -> None:
        mount = _cgroup2_mount()
        self.parent = mount / parent_name if mount is not None else None

    def create(self, name: str) -> Path | None:
        """A fresh cgroup for one container run; None when cgroups are unavailable here."""
        if self.parent is None:
            return None
        path = self.parent / name
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return path

    @staticmethod
    def joiner(cgroup: Path | None) -> Callable[[], None] | None:
        """A `preexec_fn` that moves the child into `cgroup` before it execs, so no descendant escapes."""
        if cgroup is None:
            return None
        procs = str(cgroup / "cgroup.procs")

        def join() -> None:
            with open(procs, "w") as f:
                f.write("0")

        return join

    @staticmethod
    def kill(cgroup: Path | None, pgid: int | None) -> None:
        """SIGKILL every process of the cgroup (or of the process group) and wait until none is left."""
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        if cgroup is None or not cgroup.is_dir():
            return
        deadline = time.monotonic() + 5.0
        while _populated(cgroup) and time.monotonic() < deadline:
            if (cgroup / "cgroup.kill").exists():
                (cgroup / "cgroup.kill").write_text("1")
            else:  # kernels before 5.14
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.01)

    @staticmethod
    def terminate(pgid: int) -> None:
        """SIGTERM the container's process group; what its main process does with its other children is its own."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)

    def remove(self, cgroup: Path | None) -> None:
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.rmdir()

    def sweep(self) -> int:
        """Kill and remove every container cgroup left under the parent (after a crash); how many there were."""
        if self.parent is None or not self.parent.is_dir():
            return 0
        leftovers = [d for d in self.parent.iterdir() if d.is_dir()]
        for cgroup in leftovers:
            self.kill(cgroup, None)
            self.remove(cgroup)
        with contextlib.suppress(OSError):
            self.parent.rmdir()
        return len(leftovers)


def _populated(cgroup: Path) -> bool:
    try:
        events = (cgroup / "cgroup.events").read_text()
    except OSError:
        return False
    return "populated 1" in events
