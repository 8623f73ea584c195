"""Benchmark: the memory of idle `base` sandboxes, local runtime.

Starts --sandboxes idle `base` sandboxes (default 5) at once, waits --settle seconds (default 3), and prints
each one's cgroup memory (`stats().mem_used`, what the E2B metrics call `mem_used`), its file cache
(`mem_cache`) and the rest (anonymous memory: the executor and its helpers), then their means.
--executor-source DIR runs another copy of the `executor` package (e.g. an older commit's, from `git archive`),
to compare two versions on one machine. Run as root:

    .venv/bin/python -m loadtests.bench_idle_memory [--sandboxes 5] [--settle 3] [--executor-source DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

import msgspec

from tests.runtime_fixtures import TEMPLATES, new_runtime, runtime_settings, spec

_MIB = float(1 << 20)


async def _measure(count: int, settle: float, data_dir: Path, source: Path | None) -> list[tuple[float, float]]:
    """(mem_used, mem_cache) in MiB of each sandbox, `settle` seconds after they all started."""
    settings = runtime_settings(data_dir)
    if source is not None:
        settings = msgspec.structs.replace(settings, executor_source=source.resolve())
    rt = new_runtime(settings)
    await asyncio.to_thread(rt.images.build, TEMPLATES["base"], lambda _line: None)
    ids = [f"idle{i}" for i in range(count)]
    try:
        await asyncio.gather(*(rt.start(spec(sandbox_id)) for sandbox_id in ids))
        await asyncio.sleep(settle)
        stats = [await rt.stats(sandbox_id) for sandbox_id in ids]
    finally:
        for sandbox_id in rt.sandbox_ids():
            await rt.stop(sandbox_id)
        await rt.criu_trial()
        rt.close()
    return [(s.mem_used / _MIB, s.mem_cache / _MIB) for s in stats]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=5)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--executor-source", type=Path, help="the executor package to run (default: this tree's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-idle-memory-") as tmp:
        figures = asyncio.run(_measure(args.sandboxes, args.settle, Path(tmp), args.executor_source))
    for i, (used, cache) in enumerate(figures):
        print(f"idle{i}: mem_used {used:6.1f} MiB  mem_cache {cache:6.1f} MiB  rest {used - cache:6.1f} MiB")
    used = statistics.mean(u for u, _ in figures)
    cache = statistics.mean(c for _, c in figures)
    print(f"mean of {len(figures)}: mem_used {used:6.1f} MiB  mem_cache {cache:6.1f} MiB  rest {used - cache:6.1f} MiB")


if __name__ == "__main__":
    main()
