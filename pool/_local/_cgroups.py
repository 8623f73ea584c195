"""Per-sandbox cgroups: limits, freezing, killing and usage figures, on cgroup v1 or v2.

v1 (hybrid hosts like these VMs) needs one directory per controller; v2 has one directory. Either way a
sandbox's processes join its cgroups in the launcher before bubblewrap runs, so every descendant is
accounted, frozen and killed with it.

Every sandbox's cgroups sit under one parent per server (`cgroup_root_for`), which gets a ceiling below the
machine's (`set_sandboxes_ceiling`): however many sandboxes there are and whatever they declare, together they
never take the memory or the process ids the server and the host need.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import msgspec

from pool._errors import RuntimeFailure
from pool._templates import Resources

__all__ = [
    "CgroupUsage", "HostCeiling", "SandboxCgroup", "cgroup_layout", "cgroup_root_for", "set_sandboxes_ceiling",
    "write_ceiling",
]  # fmt: skip

_V1_CONTROLLERS = ("freezer", "memory", "pids", "cpu", "cpuacct")
_CFS_PERIOD_US = 100_000


def _mounts() -> dict[str, Path]:
    """Controller name (or "unified") → mount point, from /proc/self/mountinfo."""
    found: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            point = Path(left.split()[4])
            if fstype == "cgroup2":
                found.setdefault("unified", point)
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt in _V1_CONTROLLERS:
                        found.setdefault(opt, point)
    return found


def cgroup_layout() -> tuple[str, list[str]]:
    """Which hierarchy sandboxes get ("v1", "v1 (hybrid)", "v2" or "none") and its controllers, for `doctor`."""
    mounts = _mounts()
    if all(c in mounts for c in _V1_CONTROLLERS):
        return ("v1 (hybrid)" if "unified" in mounts else "v1"), list(_V1_CONTROLLERS)
    if "unified" in mounts:
        return "v2", (mounts["unified"] / "cgroup.controllers").read_text().split()
    return "none", sorted(mounts)


def cgroup_root_for(parent: str) -> dict[str, Path]:
    """The parent cgroup directory per controller (created if missing); v2 uses the key "unified"."""
    mounts = _mounts()
    if all(c in mounts for c in _V1_CONTROLLERS):
        dirs = {c: mounts[c] / parent for c in _V1_CONTROLLERS}
    elif "unified" in mounts:
        dirs = {"unified": mounts["unified"] / parent}
    else:
        raise RuntimeFailure("no usable cgroup hierarchy: need cgroup v1 freezer/memory/pids/cpu or cgroup v2")
    for d in set(dirs.values()):
        d.mkdir(exist_ok=True)
    if "unified" in dirs:
        _enable_v2_controllers(dirs["unified"])
    return dirs


class HostCeiling(msgspec.Struct, frozen=True, kw_only=True):
    """What all sandboxes together may use (the parent cgroup's limits): None computes it from the machine
    (`auto`), 0 sets none.

    auto: memory is the machine's RAM less a reserve of a tenth of it, at least 1 GiB (but half the RAM at
    least, on a small host); process ids are half of
    what the kernel hands out (the smaller of `kernel.pid_max` and `kernel.threads-max`).
    """

    memory_mb: int | None = None
    pids: int | None = None

    def resolved(self, proc: Path = Path("/proc")) -> tuple[int | None, int | None]:
        """(memory in bytes, pids) to write, None for no limit."""
        memory, pids = self.memory_mb, self.pids
        if memory is None:
            total = _meminfo_kib(proc / "meminfo", "MemTotal") << 10
            memory_bytes: int | None = max(total - max(total // 10, 1 << 30), total // 2)  # small hosts: half
        else:
            memory_bytes = memory << 20 or None
        if pids is None:
            kernel = proc / "sys" / "kernel"
            pids = min(int((kernel / "pid_max").read_text()), int((kernel / "threads-max").read_text())) // 2
        return memory_bytes, pids or None


def set_sandboxes_ceiling(parent: str, ceiling: HostCeiling) -> tuple[int | None, int | None]:
    """Write `ceiling` to the parent cgroup `parent` (as `cgroup_root_for` names it); the (bytes, pids) written.

    RuntimeFailure when the kernel refuses it (v1 answers EBUSY to a memory limit below what is in use).
    """
    memory, pids = ceiling.resolved()
    write_ceiling(cgroup_root_for(parent), memory, pids)
    return memory, pids


def write_ceiling(roots: dict[str, Path], memory: int | None, pids: int | None) -> None:
    """Write the limits to the parent cgroup directories `roots` (v2: "unified"; v1: one per controller)."""
    v2 = "unified" in roots
    writes = (
        (roots["unified" if v2 else "memory"] / ("memory.max" if v2 else "memory.limit_in_bytes"),
         str(memory or ("max" if v2 else -1))),
        (roots["unified" if v2 else "pids"] / "pids.max", str(pids or "max")),
    )  # fmt: skip
    for path, value in writes:
        try:
            path.write_text(value)
        except OSError as exc:
            raise RuntimeFailure(f"could not set {path} to {value}: {exc}") from exc


def _meminfo_kib(path: Path, field: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise RuntimeFailure(f"{path} has no {field}")


def _enable_v2_controllers(parent: Path) -> None:
    for d in (parent.parent, parent):
        (d / "cgroup.subtree_control").write_text("+cpu +memory +pids")


class CgroupUsage:
    """Usage figures in bytes and seconds."""

    __slots__ = ("cpu_seconds", "mem_cache", "mem_used")

    def __init__(self, cpu_seconds: float, mem_used: int, mem_cache: int) -> None:
        self.cpu_seconds = cpu_seconds
        self.mem_used = mem_used
        self.mem_cache = mem_cache


class SandboxCgroup:
    """The cgroups of one sandbox."""

    def __init__(self, roots: dict[str, Path], sandbox_id: str) -> None:
        self._dirs = {c: root / sandbox_id for c, root in roots.items()}
        self._v2 = "unified" in roots

    def _dir(self, controller: str) -> Path:
        return self._dirs["unified" if self._v2 else controller]

    def create(self, resources: Resources) -> None:
        for d in set(self._dirs.values()):
            d.mkdir(exist_ok=True)
        memory = resources.memory_mb * 1024 * 1024
        quota = resources.cpu_count * _CFS_PERIOD_US
        if self._v2:
            d = self._dirs["unified"]
            (d / "memory.max").write_text(str(memory))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(resources.pids))
            (d / "cpu.max").write_text(f"{quota} {_CFS_PERIOD_US}")
            return
        (self._dir("memory") / "memory.limit_in_bytes").write_text(str(memory))
        memsw = self._dir("memory") / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(str(memory))
        (self._dir("pids") / "pids.max").write_text(str(resources.pids))
        (self._dir("cpu") / "cpu.cfs_period_us").write_text(str(_CFS_PERIOD_US))
        (self._dir("cpu") / "cpu.cfs_quota_us").write_text(str(quota))

    def sandbox_view(self) -> list[tuple[str, str]]:
        """(host directory, path inside) of what the sandbox sees read-only at /sys/fs/cgroup: its own cgroup.

        envd's /metrics reads its CPUs, memory and usage there (as in a container): v2 is the one directory, v1
        the cpu, cpuacct and memory directories under their controller names, as a v1 host mounts them.
        """
        if self._v2:
            return [(str(self._dirs["unified"]), "/sys/fs/cgroup")]
        return [(str(self._dir(c)), f"/sys/fs/cgroup/{c}") for c in ("cpu", "cpuacct", "memory")]

    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files a new process writes "0" to, to join every controller."""
        return [str(d / "cgroup.procs") for d in sorted(set(self._dirs.values()))]

    def freezer_path(self) -> Path:
        return self._dir("freezer")

    def exists(self) -> bool:
        return self._dir("freezer").is_dir()

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self._dir("freezer") / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def freeze(self) -> None:
        self._set_frozen(True)

    def thaw(self) -> None:
        self._set_frozen(False)

    def is_frozen(self) -> bool:
        if self._v2:
            return (self._dirs["unified"] / "cgroup.freeze").read_text().strip() == "1"
        return (self._dir("freezer") / "freezer.state").read_text().strip() == "FROZEN"

    def _set_frozen(self, frozen: bool) -> None:
        if self._v2:
            (self._dirs["unified"] / "cgroup.freeze").write_text("1" if frozen else "0")
            events = self._dirs["unified"] / "cgroup.events"
            want = f"frozen {int(frozen)}"
            self._wait(lambda: want in events.read_text(), "freeze" if frozen else "thaw")
            return
        state = self._dir("freezer") / "freezer.state"
        target = "FROZEN" if frozen else "THAWED"
        state.write_text(target)
        self._wait(lambda: state.read_text().strip() == target, target.lower())

    @staticmethod
    def _wait(done: object, what: str, timeout: float = 5.0) -> None:
        assert callable(done)
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"cgroup {what} did not complete within {timeout} s")
            time.sleep(0.0002)

    def kill_all(self, timeout: float = 10.0) -> None:
        """SIGKILL every process and wait until the cgroup is empty (v1 has no cgroup.kill)."""
        if not self.exists():
            return
        if self._v2:
            (self._dirs["unified"] / "cgroup.kill").write_text("1")
        else:
            self.freeze()
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            self.thaw()
        self._wait(lambda: not self.pids(), "kill", timeout)

    def remove(self) -> None:
        for d in set(self._dirs.values()):
            with contextlib.suppress(FileNotFoundError):
                d.rmdir()

    def usage(self) -> CgroupUsage:
        if self._v2:
            d = self._dirs["unified"]
            cpu = _stat_field(d / "cpu.stat", "usage_usec") / 1e6
            mem = int((d / "memory.current").read_text())
            return CgroupUsage(cpu, mem, _stat_field(d / "memory.stat", "file"))
        cpu = int((self._dir("cpuacct") / "cpuacct.usage").read_text()) / 1e9
        mem = int((self._dir("memory") / "memory.usage_in_bytes").read_text())
        return CgroupUsage(cpu, mem, _stat_field(self._dir("memory") / "memory.stat", "cache"))

    def oom_kills(self) -> int:
        path = self._dirs["unified"] / "memory.events" if self._v2 else self._dir("memory") / "memory.oom_control"
        return _stat_field(path, "oom_kill")


def _stat_field(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0
