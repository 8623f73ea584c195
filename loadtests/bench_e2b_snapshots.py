"""Benchmark: E2B's filesystem snapshots (`create_snapshot(mode="filesystem")`), through the real SDK.

    .venv/bin/python -m loadtests.bench_e2b_snapshots [--runs 5] [--sizes 0,100,1000]

For each size, a sandbox holding that many MiB of new files (random, so nothing compresses) is snapshotted
--runs times; printed: how long `create_snapshot` takes (the sandbox is frozen for the copy, most of it), and
a create from the snapshot next to a create from `base` (the baseline of the same run: the same start over
one more layer; each create timed until the SDK has the sandbox, its kill after).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from e2b import Sandbox

from loadtests._creates import sdk_creates, snapshot_copies
from loadtests._stats import row
from tests.server_fixtures import running_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="0,100,1000", help="MiB of files in the snapshotted sandbox")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, running_server(Path(tmp) / "data") as server:
        os.environ.update(server.e2b_env())
        print(row("create from base (baseline)", sdk_creates(args.runs)))
        source = Sandbox.create(timeout=3600)
        written = 0
        for size in (int(s) for s in args.sizes.split(",")):
            if size > written:
                source.commands.run(f"head -c {size - written}M /dev/urandom > ~/blob{size}", timeout=600)
                written = size
            taken, created = snapshot_copies(source, args.runs, "filesystem")
            print(row(f"create_snapshot, {size} MiB of files", taken))
            print(row("  create from that snapshot", created))
        source.kill()


if __name__ == "__main__":
    main()
