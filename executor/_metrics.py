"""`GET /metrics`: CPU, memory and disk use of the sandbox, as envd reports them.

The figures are the sandbox's own cgroup's, read at /sys/fs/cgroup: the local runtime binds the sandbox's
cgroup directories there read-only (cgroup v2: the one directory; v1: `cpu/`, `cpuacct/` and `memory/`),
and a Kubernetes container sees its own cgroup there too. So `cpu_count` is the CPU quota rounded up,
`mem_total` the memory limit, `mem_used` what the cgroup is charged (page cache included, as the control
plane's `get_metrics` counts it) and `mem_cache` its page cache. Without a readable cgroup (or without a
limit) the machine's figures from /proc stand in. CPU use is the share of the available CPUs used since
the previous call (0 on the first call). Disk is the root filesystem's (statvfs "/"): in a local sandbox
the filesystem that holds its writable layer, which is what the sandbox can fill.
"""

from __future__ import annotations

import math
import os
import time

__all__ = ("Metrics",)

CGROUP = "/sys/fs/cgroup"
MIB = 1024 * 1024


class Metrics:
    """Produces metrics snapshots; remembers the previous CPU reading to compute usage."""

    def __init__(self, cgroup: str = CGROUP) -> None:
        self._cgroup = cgroup
        self._v1 = os.path.isdir(f"{cgroup}/memory") and not os.path.exists(f"{cgroup}/memory.max")
        self._previous: tuple[float, float] | None = None  # (wall seconds, busy cpu seconds)

    def snapshot(self) -> dict[str, float | int]:
        cpus = self._cpu_count()
        mem_total, mem_used, mem_cache = self._memory()
        disk = os.statvfs("/")
        return {
            "ts": int(time.time()),
            "cpu_count": cpus,
            "cpu_used_pct": round(self._cpu_used_pct(cpus), 2),
            "mem_total": mem_total,
            "mem_used": mem_used,
            "mem_cache": mem_cache,
            "mem_total_mib": mem_total // MIB,
            "mem_used_mib": mem_used // MIB,
            "disk_used": (disk.f_blocks - disk.f_bfree) * disk.f_frsize,
            "disk_total": disk.f_blocks * disk.f_frsize,
        }

    def _cpu_count(self) -> int:
        if self._v1:
            quota, period = self._number("cpu/cpu.cfs_quota_us"), self._number("cpu/cpu.cfs_period_us")
        else:
            text, _, period_text = (self._read("cpu.max") or "max").partition(" ")
            quota, period = _int(text), _int(period_text)
        if quota is not None and quota > 0 and period:
            return max(1, math.ceil(quota / period))
        return os.cpu_count() or 1

    def _cpu_used_pct(self, cpus: int) -> float:
        now, busy = time.monotonic(), self._busy_seconds()
        previous, self._previous = self._previous, (now, busy)
        if previous is None or now <= previous[0] or busy < previous[1]:
            return 0.0  # the first call, or a new cgroup (a restored checkpoint) whose counter started again
        return min(100.0, 100.0 * (busy - previous[1]) / ((now - previous[0]) * cpus))

    def _busy_seconds(self) -> float:
        if self._v1 and (nanoseconds := self._number("cpuacct/cpuacct.usage")) is not None:
            return nanoseconds / 1e9
        stat = _fields(self._read("cpu.stat"))
        if "usage_usec" in stat:
            return stat["usage_usec"] / 1e6
        ticks = [int(value) for value in (_read("/proc/stat") or "cpu 0").splitlines()[0].split()[1:]]
        idle = sum(ticks[3:5])  # idle + iowait
        return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")

    def _memory(self) -> tuple[int, int, int]:
        meminfo = {key: value * 1024 for key, value in _fields(_read("/proc/meminfo"), ":").items()}
        total = meminfo.get("MemTotal", 0)
        prefix, limit_file, current_file, cache_key = (
            ("memory/", "memory.limit_in_bytes", "memory.usage_in_bytes", "cache")
            if self._v1
            else ("", "memory.max", "memory.current", "file")
        )
        current = self._number(prefix + current_file)
        if current is None:
            return total, total - meminfo.get("MemAvailable", 0), meminfo.get("Cached", 0)
        limit = self._number(prefix + limit_file)  # v1 says "no limit" with a huge number
        cache = _fields(self._read(prefix + "memory.stat")).get(cache_key, 0)
        return (limit if limit is not None and 0 < limit < total else total), current, cache

    def _read(self, name: str) -> str | None:
        return _read(f"{self._cgroup}/{name}")

    def _number(self, name: str) -> int | None:
        return _int(self._read(name) or "")


def _int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else None


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def _fields(text: str | None, separator: str = " ") -> dict[str, int]:
    """`key value` (or `key: value kB`) lines → {key: value}."""
    fields = {}
    for line in (text or "").splitlines():
        key, _, rest = line.partition(separator)
        value = rest.split()[0] if rest.split() else ""
        if value.isdigit():
            fields[key.strip()] = int(value)
    return fields
