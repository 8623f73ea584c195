"""Benchmark: E2B volumes through the real SDK, each next to its baseline in the same run.

    .venv/bin/python -m loadtests.bench_volumes [--runs 10] [--mib 16]

Printed: a create that mounts a volume next to a create without one (both cold: a serve without warm pools,
since creates with volumes skip them), `Volume.create` (an ext4 image made and mounted), and the content
API's `write_file`/`read_file` of --mib MiB next to the sandbox files API's (envd's `files.write`/`read`)
of the same bytes.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from e2b import Sandbox, Volume

from loadtests._stats import row
from tests.server_fixtures import running_server


def _ms(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()
    blob = os.urandom(args.mib << 20)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp, running_server(Path(tmp) / "data") as server:
        os.environ.update(server.e2b_env())
        made, plain, mounted = [], [], []
        volume = Volume.create("bench")
        for run in range(args.runs):
            began = time.perf_counter()
            Volume.destroy(Volume.create(f"bench-{run}").volume_id)
            made.append(_ms(began))
            began = time.perf_counter()
            Sandbox.create().kill()
            plain.append(_ms(began))
            began = time.perf_counter()
            Sandbox.create(volume_mounts={"/data": volume}).kill()
            mounted.append(_ms(began))
        print(row("create, no volume (baseline, cold)", plain))
        print(row("create with a volume mounted", mounted))
        print(row("Volume.create + destroy", made))
        sandbox = Sandbox.create(timeout=600)
        envd_write, envd_read, volume_write, volume_read = [], [], [], []
        for _ in range(args.runs):
            began = time.perf_counter()
            sandbox.files.write("/tmp/blob", blob)
            envd_write.append(_ms(began))
            began = time.perf_counter()
            sandbox.files.read("/tmp/blob", format="bytes")
            envd_read.append(_ms(began))
            began = time.perf_counter()
            volume.write_file("/blob", blob)
            volume_write.append(_ms(began))
            began = time.perf_counter()
            volume.read_file("/blob", format="bytes")
            volume_read.append(_ms(began))
        sandbox.kill()
        print(row(f"files.write {args.mib} MiB (baseline: envd)", envd_write))
        print(row(f"volume.write_file {args.mib} MiB", volume_write))
        print(row(f"files.read {args.mib} MiB (baseline: envd)", envd_read))
        print(row(f"volume.read_file {args.mib} MiB", volume_read))
        Volume.destroy(volume.volume_id)


if __name__ == "__main__":
    main()
