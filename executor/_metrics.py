"""`GET /metrics`: CPU, memory and disk use of the sandbox, as envd reports them.

The sandbox's own cgroup (v2, at /sys/fs/cgroup) is preferred when its files are readable; /proc
is the fallback. CPU use is the share of the available CPUs used since the previous call (0 on
the first call).
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
        quota, _, period = (_read(f"{self._cgroup}/cpu.max") or "max").partition(" ")
        if quota != "max" and period.strip().isdigit():
            return max(1, math.ceil(int(quota) / int(period)))
        return os.cpu_count() or 1

    def _cpu_used_pct(self, cpus: int) -> float:
        now, busy = time.monotonic(), self._busy_seconds()
        previous, self._previous = self._previous, (now, busy)
        if previous is None or now <= previous[0]:
            return 0.0
        return min(100.0, 100.0 * (busy - previous[1]) / ((now - previous[0]) * cpus))

    def _busy_seconds(self) -> float:
        stat = _fields(_read(f"{self._cgroup}/cpu.stat"))
        if "usage_usec" in stat:
            return stat["usage_usec"] / 1e6
        ticks = [int(value) for value in (_read("/proc/stat") or "cpu 0").splitlines()[0].split()[1:]]
        idle = sum(ticks[3:5])  # idle + iowait
        return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")

    def _memory(self) -> tuple[int, int, int]:
        meminfo = {key: value * 1024 for key, value in _fields(_read("/proc/meminfo"), ":").items()}
        total = meminfo.get("MemTotal", 0)
        limit = (_read(f"{self._cgroup}/memory.max") or "max").strip()
        current = (_read(f"{self._cgroup}/memory.current") or "").strip()
        if current.isdigit():
            cache = _fields(_read(f"{self._cgroup}/memory.stat")).get("file", 0)
            return (int(limit) if limit.isdigit() else total), int(current), cache
        return total, total - meminfo.get("MemAvailable", 0), meminfo.get("Cached", 0)


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
