"""Benchmark: what the disk limit costs (`pool._local._disk`), with it and without it in the same run.

Two local runtimes, one with `disk_limit=True` (each sandbox's writable layer on an ext4 image of its
`disk_mb`) and one with `disk_limit=False` (plain directories on the data directory's filesystem, no
limit), print, in turn:

- cold start (`runtime.start`) to a ready executor, and the stop (`runtime.stop`, files deleted);
- warm claim: `WarmPools.claim()` (pop + `POST /init`) on a pool the runtime keeps full;
- write throughput inside: `dd` of 256 MiB with `conv=fdatasync`, and 2,000 small files made and synced;
- `stats()` (E2B metrics) of a sandbox holding 20,000 files: one statvfs with the limit, a walk without;
- the stop of that sandbox.

The audit's cross-tenant case (another key's create while a sandbox's metrics are polled) goes through the API:
`loadtests/bench_cross_tenant.py`.

Run as root:

    .venv/bin/python -m loadtests.bench_disk --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

import msgspec

from activator._records import new_sandbox_id
from loadtests._stats import percentile, row
from pool import ExecutorInit, LocalRuntime
from pool._warm import WarmPools
from tests.runtime_fixtures import TEMPLATES, new_runtime, runtime_settings, spec
from tests.sandbox_exec import run_in_sandbox

_DD = "dd if=/dev/zero of=$HOME/big bs=1M count=256 conv=fdatasync 2>&1 | tail -1 | awk '{print $(NF-1), $NF}'"
_SMALL = (  # milliseconds to make and sync 2,000 empty files
    "mkdir -p $HOME/s && cd $HOME/s && s=$(date +%s%N) && seq 2000 | xargs touch && sync && "
    "echo $(( ($(date +%s%N) - s) / 1000000 ))"
)
_MANY = "mkdir -p $HOME/many && cd $HOME/many && seq 20000 | xargs touch"


async def _ms(call: Awaitable[object]) -> float:
    began = time.perf_counter()
    await call
    return (time.perf_counter() - began) * 1000


def _mb_per_s(dd_tail: str) -> float:
    value, unit = dd_tail.split()
    return float(value) * {"GB/s": 1000.0, "MB/s": 1.0, "kB/s": 0.001}[unit]


async def _measure(rt: LocalRuntime, runs: int, label: str) -> None:
    await rt.stop(await _start(rt, "warmup"))
    starts, stops, claims, dd, small, stats, big_stops = [], [], [], [], [], [], []
    for i in range(runs):
        sandbox_id = f"cold{i}"
        starts.append(await _ms(rt.start(spec(sandbox_id))))
        stops.append(await _ms(rt.stop(sandbox_id)))
    pools = WarmPools(rt, TEMPLATES, new_id=new_sandbox_id, targets={"base": 1})
    refill = asyncio.create_task(pools.run())
    try:
        for _ in range(runs):
            async with asyncio.timeout(60):
                while pools.stats()["base"].ready < 1:
                    await pools.changed()
            began = time.perf_counter()
            claimed = await pools.claim("base", ExecutorInit())
            claims.append((time.perf_counter() - began) * 1000)
            assert claimed is not None
            await rt.stop(claimed)
    finally:
        refill.cancel()
        await asyncio.gather(refill, return_exceptions=True)
        await pools.close()
    for i in range(max(3, runs // 4)):
        sandbox_id = await _start(rt, f"io{i}")
        dd.append(_mb_per_s((await run_in_sandbox(rt, sandbox_id, _DD)).stdout))
        small.append(float((await run_in_sandbox(rt, sandbox_id, _SMALL)).stdout))
        await run_in_sandbox(rt, sandbox_id, _MANY)
        for _ in range(5):
            stats.append(await _ms(rt.stats(sandbox_id)))
        big_stops.append(await _ms(rt.stop(sandbox_id)))
    print(f"--- {label}")
    print(row("cold start (executor ready)", starts))
    print(row("stop of a fresh sandbox", stops))
    print(row("warm claim (pop + /init)", claims))
    print(f"{'write 256 MiB + fdatasync inside':<44} p50 {percentile(dd, 50):7.0f} MB/s  n={len(dd)}")
    print(row("2,000 small files + sync inside", small))
    print(row("stats() with 20,000 files inside", stats))
    print(row("stop of a sandbox with 20,000 files", big_stops))


async def _start(rt: LocalRuntime, sandbox_id: str) -> str:
    await rt.start(spec(sandbox_id))
    return sandbox_id


async def _both(runs: int, root: Path) -> None:
    for label, limit in (("disk limit on (ext4 image per sandbox)", True), ("disk limit off (baseline)", False)):
        settings = msgspec.structs.replace(runtime_settings(root / label.split()[2], criu=False), disk_limit=limit)
        rt = new_runtime(settings)
        await asyncio.to_thread(rt.images.build, TEMPLATES["base"], lambda _line: None)
        try:
            await _measure(rt, runs, label)
        finally:
            for sandbox_id in rt.sandbox_ids():
                await rt.stop(sandbox_id)
            await rt.criu_trial()
            rt.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-disk-", dir="/var/tmp") as tmp:
        asyncio.run(_both(args.runs, Path(tmp)))


if __name__ == "__main__":
    main()
