"""One sandbox of the local runtime: its in-memory record and the files that describe it in its directory.

`<data_dir>/sandboxes/<id>/` holds everything a restarted server needs to find the sandbox again:

    slot             its uid range (`_userns`), taken from the machine-wide `SlotAllocator`
    resources.json   the limits its cgroups get
    layers.json      the exact template layers under its overlay, pinned at start: a snapshot must come back
                     over the files its processes had open, whatever the template has become since
    upper/, work/    the overlay's writable layer: the sandbox's own files (this is the filesystem snapshot)
    pid              host pid of its pid 1 (the executor) while it runs
    start-pids.json  pids inside of the template's start commands, to tell them from the user's processes
    egress.json      the `EgressRules` in force, re-applied when the sandbox comes back (restore, restart)
    snapshot.json    present while snapshotted (written before a snapshot begins, removed once a restore is
                     complete): its `SnapshotInfo`
    checkpoint/      CRIU's memory image while snapshotted with kind "criu"
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import msgspec

from pool._local._cgroups import SandboxCgroup
from pool._runtime import EgressRules, SnapshotInfo
from pool._templates import Resources
from pool._warm import NO_EGRESS

__all__ = ["Sandbox", "load_sandbox", "tree_size"]


class Sandbox:
    """A sandbox the runtime knows. Owned by the event loop thread; `netns_fd` is closed when it stops."""

    __slots__ = (
        "cgroup", "directory", "fresh_netns", "last_cpu", "netns_fd", "pid", "process", "resources", "slot",
        "stopping",
    )  # fmt: skip

    def __init__(self, directory: Path, slot: int, cgroup: SandboxCgroup, resources: Resources) -> None:
        self.directory = directory
        self.resources = resources
        self.slot = slot
        self.cgroup = cgroup
        self.process: subprocess.Popen[bytes] | None = None  # the launcher we forked; None once restored
        self.pid = 0
        self.netns_fd = -1
        # Its network namespace was made by this process's launch and holds no egress table yet (not one CRIU
        # restored or a previous server left): its first egress is a creation, ~10 ms cheaper than a replacement.
        self.fresh_netns = False
        self.stopping = False  # set before every deliberate end, so the exit watcher does not call it a crash
        self.last_cpu = (time.monotonic(), 0.0)

    @property
    def sandbox_id(self) -> str:
        return self.directory.name

    def layers(self) -> list[Path]:
        return [Path(p) for p in msgspec.json.decode((self.directory / "layers.json").read_bytes(), type=list[str])]

    def recorded_pid(self) -> int:
        return _read_int(self.directory / "pid")

    def start_pids(self) -> list[int]:
        try:
            return msgspec.json.decode((self.directory / "start-pids.json").read_bytes(), type=list[int])
        except (OSError, msgspec.DecodeError):
            return []

    def set_start_pids(self, pids: list[int]) -> None:
        (self.directory / "start-pids.json").write_bytes(msgspec.json.encode(pids))  # tiny: fine on the loop

    def egress_rules(self) -> EgressRules:
        """The rules last applied; none recorded (a sandbox that never got its egress) means no egress."""
        try:
            return msgspec.json.decode((self.directory / "egress.json").read_bytes(), type=EgressRules)
        except (OSError, msgspec.DecodeError):
            return NO_EGRESS

    def set_egress_rules(self, rules: EgressRules) -> None:
        """Record the rules in force; not fsynced (it is on every start's path): a crash that loses them leaves
        a re-adopted sandbox without egress, never with more than it had."""
        temporary = self.directory / "egress.json.tmp"
        temporary.write_bytes(msgspec.json.encode(rules))
        temporary.rename(self.directory / "egress.json")

    def snapshot_info(self) -> SnapshotInfo | None:
        try:
            return msgspec.json.decode((self.directory / "snapshot.json").read_bytes(), type=SnapshotInfo)
        except (OSError, msgspec.DecodeError):
            return None

    def set_snapshot_info(self, info: SnapshotInfo | None) -> None:
        """Record (None: forget) that the sandbox is snapshotted, atomically and durably."""
        path = self.directory / "snapshot.json"
        if info is None:
            path.unlink(missing_ok=True)
        else:
            _write_atomically(path, msgspec.json.encode(info))


def load_sandbox(directory: Path, cgroup_roots: dict[str, Path]) -> Sandbox | None:
    """The sandbox recorded in `directory`, or None when it died before its slot was recorded."""
    slot = _read_int(directory / "slot")
    if not slot:
        return None
    try:
        resources = msgspec.json.decode((directory / "resources.json").read_bytes(), type=Resources)
    except (OSError, msgspec.DecodeError):
        resources = Resources()
    return Sandbox(directory, slot, SandboxCgroup(cgroup_roots, directory.name), resources)


def tree_size(root: Path) -> int:
    """Bytes on disk under `root` (blocking)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    temporary.rename(path)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0
