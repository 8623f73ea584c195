"""A sandbox's resource figures from its executor's `GET /metrics` (envd's shape), as `SandboxStats`."""

from __future__ import annotations

import socket

import msgspec

from pool._errors import RuntimeFailure
from pool._executor_client import get
from pool._runtime import SandboxStats

__all__ = ["read_metrics"]


class _Metrics(msgspec.Struct, kw_only=True):
    cpu_count: int = 0
    cpu_used_pct: float = 0.0
    mem_used: int = 0
    mem_total: int = 0
    mem_cache: int = 0
    disk_used: int = 0
    disk_total: int = 0


_decoder = msgspec.json.Decoder(_Metrics)


async def read_metrics(sock: socket.socket, token: str | None) -> SandboxStats:
    """The executor's figures; `cpu_seconds` is not among them and is reported as 0."""
    body = await get(sock, "/metrics", token)
    try:
        m = _decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise RuntimeFailure(f"executor sent bad metrics: {body[:300]!r}") from exc
    return SandboxStats(
        cpu_count=m.cpu_count, cpu_used_pct=m.cpu_used_pct, cpu_seconds=0.0, mem_used=m.mem_used,
        mem_total=m.mem_total, mem_cache=m.mem_cache, disk_used=m.disk_used, disk_total=m.disk_total,
    )  # fmt: skip
