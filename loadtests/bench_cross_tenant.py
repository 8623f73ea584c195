"""Benchmark: the security audit's cross-tenant stall, through the E2B API, with the disk limit on and off, same run.

    .venv/bin/python -m loadtests.bench_cross_tenant [--files 300000] [--runs 8]

Key A's sandbox holds `--files` files while 24 `curl` loops poll its `GET /sandboxes/{id}/metrics` as fast as
the server answers (the audit's); key B creates a sandbox, runs a command in it and kills it, first
with nothing else going on, then during the polling. Printed for a server with each writable layer on a
filesystem of its own (`--sandbox-disk-limit on`, the default: a sample is one statvfs) and one without (a
sample walks the files, in a pool of its own): p50/p99 of B's create, and the ratio to its baseline, which
the issue wants within 2. The audit measured 66.5 s against a 0.65 s baseline (100 times) on the old code.
The same polling of an empty sandbox is the control: what the files cost is the difference between the two.
The loops run on the server's own cores, so two more series tell what the server does from what the machine
does: the loops at `SCHED_IDLE` (`chrt --idle`), whose processes then get only the CPU the rest leaves, as an
attacker's on another machine would; and the same loops polling a sandbox of another server on this machine
(one that shares nothing with B's but the cores): what is left over that control is what the flood costs B
through the server they share.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from e2b import Sandbox

from loadtests._stats import percentile, row
from tests.server_fixtures import RunningServer, running_server
from tests.ui_fixtures import new_key, sdk_options

POLLERS = 24


def _create_ms(api_key: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        sandbox = Sandbox.create(api_key=api_key)
        sandbox.commands.run("true")
        sandbox.kill()
        times.append((time.perf_counter() - began) * 1000)
    return times


def _pollers(server: RunningServer, sandbox_id: str, *, idle: bool) -> list[subprocess.Popen[bytes]]:
    """The audit's 24 `curl` loops on A's metrics, each as fast as the server answers it; at `SCHED_IDLE` if `idle`."""
    url = f"{server.url}/sandboxes/{sandbox_id}/metrics"
    loop = f"while :; do curl -s -o /dev/null -H 'X-API-Key: {server.api_key}' {url}; done"
    argv = [*(["chrt", "--idle", "0"] if idle else []), "bash", "-c", loop]
    return [subprocess.Popen(argv, start_new_session=True) for _ in range(POLLERS)]


def _while_polled(server: RunningServer, sandbox_id: str, key_b: str, runs: int, *, idle: bool = False) -> list[float]:
    pollers = _pollers(server, sandbox_id, idle=idle)
    try:
        time.sleep(3)  # all of them polling, past the burst a key may make before its pace holds it (`_pacing`)
        return _create_ms(key_b, runs)
    finally:
        for poller in pollers:
            os.killpg(poller.pid, signal.SIGKILL)
            poller.wait()


def _measure(label: str, server: RunningServer, elsewhere: tuple[RunningServer, str], files: int, runs: int) -> None:
    os.environ.update(server.e2b_env())
    key_b = new_key(server, "tenant-b")
    empty, crowded = Sandbox.create(timeout=3600), Sandbox.create(timeout=3600)
    crowded.commands.run(f"mkdir ~/f && cd ~/f && seq {files} | xargs touch", timeout=600)
    os.sync()  # their writeback is not the flood's: without this it lands in the first series measured
    alone = _create_ms(key_b, runs)
    series = {
        "another server on this machine polled": _while_polled(*elsewhere, key_b, runs),
        "an empty sandbox polled": _while_polled(server, empty.sandbox_id, key_b, runs),
        f"A's {files:,} files polled": _while_polled(server, crowded.sandbox_id, key_b, runs),
        "  the same, the curl loops at SCHED_IDLE": _while_polled(server, crowded.sandbox_id, key_b, runs, idle=True),
    }
    empty.kill()
    crowded.kill()
    print(f"--- {label}")
    print(row("key B: create + command + kill, alone", alone))
    for what, times in series.items():
        print(row(f"  ... {what}", times))
    for what, times in series.items():
        print(f"{'  ratio (p50), ' + what.strip():<64} {percentile(times, 50) / percentile(alone, 50):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as other, running_server(Path(other) / "data") as elsewhere:
        target = Sandbox.create(timeout=3600, **sdk_options(elsewhere, elsewhere.api_key))
        for label, flag in (("disk limit on (a sample is a statvfs)", "on"), ("disk limit off (samples walk)", "off")):
            with (
                tempfile.TemporaryDirectory(dir="/var/tmp") as tmp,
                running_server(Path(tmp) / "data", "--sandbox-disk-limit", flag) as server,
            ):
                _measure(label, server, (elsewhere, target.sandbox_id), args.files, args.runs)


if __name__ == "__main__":
    main()
