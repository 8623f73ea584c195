"""Benchmark: time from "start sandbox" to "its executor answers GET /health", local runtime.

Prints p50 / p99 over --runs starts, next to a bare `python3 -c pass` on the host measured in the same run
(the floor any Python daemon pays), so the figures can be read on a noisy machine. Run as root:

    .venv/bin/python -m loadtests.bench_start --runs 40
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from pathlib import Path

from executor.envd import ENVD_PORT
from loadtests._stats import row
from pool import LocalRuntime
from tests.runtime_fixtures import local_runtime, spec


async def _health(runtime: LocalRuntime, sandbox_id: str) -> None:
    reader, writer = await asyncio.open_connection(sock=await runtime.open_socket(sandbox_id, ENVD_PORT))
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status = await reader.readline()
    writer.close()
    assert status.split()[1] == b"204", status


async def _measure(runs: int, data_dir: Path) -> tuple[list[float], list[float]]:
    starts, stops = [], []
    async with local_runtime(data_dir) as runtime:
        await runtime.start(spec("warmup"))
        await runtime.stop("warmup")
        for i in range(runs):
            began = time.perf_counter()
            await runtime.start(spec(f"bench{i}"))
            await _health(runtime, f"bench{i}")
            starts.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            await runtime.stop(f"bench{i}")
            stops.append((time.perf_counter() - began) * 1000)
    return starts, stops


def _python_floor(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-c", "pass"], check=True)
        times.append((time.perf_counter() - began) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    floor = _python_floor(args.runs)
    with tempfile.TemporaryDirectory(prefix="bench-start-") as tmp:
        starts, stops = asyncio.run(_measure(args.runs, Path(tmp)))
    print(row("baseline: python3 -c pass on the host", floor))
    print(row("start sandbox -> executor answers /health", starts))
    print(row("stop sandbox (kill cgroup, unmount, remove)", stops))


if __name__ == "__main__":
    main()
