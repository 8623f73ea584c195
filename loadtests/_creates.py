"""Timed E2B creates through a running server, each on an otherwise idle server: shared by the benchmarks."""

from __future__ import annotations

import re
import time
from typing import Literal

import httpx
from e2b import Sandbox

from tests.server_fixtures import RunningServer

__all__ = ["sdk_creates", "snapshot_copies", "timed_creates"]


def _pool_ready(client: httpx.Client, pool: str) -> bool:
    match = re.search(rf'warm_pool_ready\{{template="{re.escape(pool)}"\}} (\d+)', client.get("/metrics").text)
    return match is not None and int(match[1]) >= 1


def timed_creates(server: RunningServer, reference: str, runs: int, *, pool: str | None = None) -> list[float]:
    """Milliseconds of `runs` creates (`POST /v2/sandboxes` → 201) of `reference`, each sandbox killed after;
    with `pool` (a warm pool's name) each create first waits for the pool to hold a ready sandbox. One more
    create before them warms caches and is not counted."""
    times = []
    with httpx.Client(base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=120) as client:
        for _ in range(runs + 1):
            deadline = time.monotonic() + 120
            while pool and not _pool_ready(client, pool) and time.monotonic() < deadline:
                time.sleep(0.05)
            began = time.perf_counter()
            created = client.post("/v2/sandboxes", json={"templateID": reference})
            created.raise_for_status()
            times.append((time.perf_counter() - began) * 1000)
            client.delete(f"/sandboxes/{created.json()['sandboxID']}")
    return times[1:]


def sdk_creates(runs: int) -> list[float]:
    """Milliseconds of `runs` creates of `base` with the E2B SDK (the server its environment names), each sandbox
    killed after: the baseline of benchmarks that time the SDK's own calls."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        sandbox = Sandbox.create()
        times.append((time.perf_counter() - began) * 1000)
        sandbox.kill()
    return times


def snapshot_copies(source: Sandbox, runs: int, mode: Literal["full", "filesystem"]) -> tuple[list[float], list[float]]:
    """Milliseconds of `runs` `create_snapshot(mode=)` of `source`, and of a create from each (killed after, and
    the snapshot deleted)."""
    taken, created = [], []
    for _ in range(runs):
        began = time.perf_counter()
        snapshot = source.create_snapshot(mode=mode)
        taken.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        copy = Sandbox.create(snapshot.snapshot_id)
        created.append((time.perf_counter() - began) * 1000)
        copy.kill()
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    return taken, created
