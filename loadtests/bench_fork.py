"""Benchmark: E2B's fork with memory (`sbx.fork(count=)`), through the real SDK, next to a cold create.

    .venv/bin/python -m loadtests.bench_fork [--runs 5] [--counts 1,4] [--mib 0,256]

One server (no warm pool, so `Sandbox.create()` is a cold start: the baseline of the same run). For each
size, a source sandbox whose background process holds that many MiB of memory (random, so nothing
compresses) is forked --runs times for each count; printed: how long `fork` takes until every fork is ready,
and that time per copy (the goal: at most 300 ms). Then the same copies through snapshots: `create_snapshot` with
mode "full" (memory) and "filesystem" (files only), and a `Sandbox.create` from each (the first goes on from
the memory, the second starts its processes afresh).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Literal

from e2b import Sandbox

from loadtests._creates import sdk_creates, snapshot_copies
from loadtests._stats import row
from tests.server_fixtures import running_server

_HOLD = (
    'python3 -c \'import os, time; heap = os.urandom({mib} << 20); open("/tmp/held", "w").close(); time.sleep(1e6)\''
)


def _ms(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def _source(mib: int) -> Sandbox:
    source = Sandbox.create(timeout=3600)
    source.commands.run(_HOLD.format(mib=mib), background=True)
    source.commands.run("until [ -e /tmp/held ]; do sleep 0.05; done", timeout=120)
    return source


def _forks(source: Sandbox, count: int, runs: int) -> tuple[list[float], list[float]]:
    """(each fork call's ms, its ms per copy)."""
    whole, per_copy = [], []
    for _ in range(runs):
        began = time.perf_counter()
        forks = source.fork(count=count, timeout=120)
        elapsed = _ms(began)
        failed = [fork for fork in forks if not isinstance(fork, Sandbox)]
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()
        if failed:
            raise SystemExit(f"fork failed: {failed}")
        whole.append(elapsed)
        per_copy.append(elapsed / count)
    return whole, per_copy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--counts", default="1,4", help="forks per request")
    parser.add_argument("--mib", default="0,256", help="MiB held in the source's memory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, running_server(Path(tmp) / "data") as server:
        os.environ.update(server.e2b_env())
        print(row("cold create (baseline)", sdk_creates(args.runs)))
        for mib in (int(m) for m in args.mib.split(",")):
            source = _source(mib)
            try:
                for count in (int(c) for c in args.counts.split(",")):
                    whole, per_copy = _forks(source, count, args.runs)
                    print(row(f"fork, {mib} MiB held, count={count}", whole))
                    print(row("  per copy", per_copy))
                modes: tuple[tuple[Literal["full", "filesystem"], str], ...] = (
                    ("full", "memory"),
                    ("filesystem", "files"),
                )
                for mode, kept in modes:
                    taken, created = snapshot_copies(source, args.runs, mode)
                    print(row(f"  create_snapshot(mode={mode!r})", taken))
                    print(row(f"  create from it ({kept})", created))
            finally:
                source.kill()


if __name__ == "__main__":
    main()
