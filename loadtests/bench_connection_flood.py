"""Benchmark: `/health` and a create with no other traffic, then while 21,000 idle connections are held, same run.

    .venv/bin/python -m loadtests.bench_connection_flood [--connections 21000] [--runs 20]

The audit's fd-exhaustion attack (`security-audit.md` §3): processes of 7,000 idle TCP connections each, from
their own loopback addresses, held without a byte sent. Prints p50/p99 of `/health` and of an E2B create (with a
command, then a kill) before and during the flood, the ratio of the p50s, and the server's open descriptors.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx
from e2b import Sandbox

from loadtests._stats import percentile, row
from tests.server_fixtures import RunningServer, running_server
from tests.test_gateway_abuse import idle_connections, server_fds


def _health_ms(server: RunningServer, runs: int) -> list[float]:
    times = []
    with httpx.Client(timeout=30) as client:
        for _ in range(runs):
            start = time.perf_counter()
            client.get(f"{server.url}/health", headers={"Connection": "close"}).raise_for_status()
            times.append((time.perf_counter() - start) * 1000)
    return times


def _create_ms(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sbx = Sandbox.create()
        sbx.commands.run("true")
        times.append((time.perf_counter() - start) * 1000)
        sbx.kill()
    return times


def _measure(label: str, server: RunningServer, runs: int) -> tuple[list[float], list[float]]:
    health, create = _health_ms(server, runs), _create_ms(max(1, runs // 5))
    print(row(f"{label}: /health", health))
    print(row(f"{label}: create + command", create))
    print(f"{label}: server holds {server_fds(server)} file descriptors")
    return health, create


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=21_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp) / "data") as server:
        os.environ.update(server.e2b_env())
        base_health, base_create = _measure("baseline", server, args.runs)
        with idle_connections(server, args.connections):
            health, create = _measure(f"{args.connections} idle", server, args.runs)
    for what, base, under in (("/health", base_health, health), ("create", base_create, create)):
        print(f"{what}: p50 under the flood / baseline = {percentile(under, 50) / percentile(base, 50):.2f}")


if __name__ == "__main__":
    main()
