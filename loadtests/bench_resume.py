"""Benchmark: first byte from a paused (frozen) and from a snapshotted sandbox, through the gateway.

Starts `agent-sandbox serve` (a subprocess, `--pause-after 1 --snapshot-after 0`: idle sandboxes freeze, only
E2B's pause snapshots), creates --sandboxes sandboxes (auto-resume on) each running a small asyncio counting
server with an 8 MiB heap, and measures, each from the request's first byte sent to the response's first
byte received on an already-open client connection:

    baseline   a running sandbox (woken just before), through the same gateway, in the same run
    frozen     a sandbox the idle policy froze (the request thaws it, then connects)
    snapshot   a sandbox E2B's pause scaled to zero (the request restores it; the kind is printed)

plus the pause (freeze) and snapshot durations the server logged for those transitions, how long the E2B
pause call took end to end, and the memory a frozen sandbox keeps (its cgroup's usage). Run as root:

    .venv/bin/python -m loadtests.bench_resume --sandboxes 30 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from e2b import Sandbox

from loadtests._stats import percentile, row
from tests.polling import wait_for
from tests.scale_to_zero_fixtures import host, sandboxes_by_state, start_counter
from tests.server_fixtures import RunningServer, running_server

_TRANSITION = re.compile(r"transition=(\w+)->(\w+) reason=(\S+) ms=([\d.]+)")


async def first_byte_ms(gateway_port: int, sandbox_id: str, path: str) -> float:
    """Milliseconds from the request's first byte sent to the response's first byte, on an open connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway_port)
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {host(sandbox_id)}\r\nConnection: close\r\n\r\n".encode()
        began = time.perf_counter()
        writer.write(request)
        first = await reader.read(1)
        elapsed = (time.perf_counter() - began) * 1000
        rest = await reader.read()
        if not (first + rest).startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"sandbox {sandbox_id} answered {(first + rest)[:200]!r}")
        return elapsed
    finally:
        writer.close()


def measure(server: RunningServer, sandbox_id: str, path: str = "/hit/bench") -> float:
    return asyncio.run(first_byte_ms(server.port, sandbox_id, path))


def logged(server_log: Path, sources: str, target: str) -> list[float]:
    """The `ms=` of every logged transition from one of `sources` (a|b) to `target`."""
    found = (_TRANSITION.search(line) for line in server_log.read_text().splitlines())
    return [float(m.group(4)) for m in found if m and m.group(1) in sources.split("|") and m.group(2) == target]


@contextmanager
def sandboxes(count: int) -> Iterator[list[Sandbox]]:
    boxes: list[Sandbox] = []
    try:
        for _ in range(count):
            sbx = Sandbox.create(timeout=3600, lifecycle={"on_timeout": "pause", "auto_resume": True})
            boxes.append(sbx)
            start_counter(sbx)
        yield boxes
    finally:
        for sbx in boxes:
            sbx.kill()


def run(server: RunningServer, count: int, rounds: int) -> None:
    wait_for(
        lambda: "still running" not in str(httpx.get(f"{server.url}/health").json()), what="the CRIU trial", within=60
    )
    runtime = httpx.get(f"{server.url}/health").json().get("runtime", {})
    baseline, frozen, snapshot, pause_calls, frozen_mem = [], [], [], [], []
    with sandboxes(count) as boxes:
        for _ in range(rounds):
            for sbx in boxes:
                measure(server, sbx.sandbox_id)  # wake it (untimed), then time a running one
                baseline.append(measure(server, sbx.sandbox_id))
            wait_for(lambda: sandboxes_by_state(server)["paused"] == count, what="every sandbox to freeze", within=30)
            for sbx in boxes:
                (sample,) = sbx.get_metrics()  # control-plane call: does not wake it
                frozen_mem.append(sample.mem_used / (1 << 20))
            for sbx in boxes:
                frozen.append(measure(server, sbx.sandbox_id))
        for _ in range(rounds):
            for sbx in boxes:
                began = time.perf_counter()
                assert sbx.pause()
                pause_calls.append((time.perf_counter() - began) * 1000)
            for sbx in boxes:
                snapshot.append(measure(server, sbx.sandbox_id))
    log = server.data_dir.parent / f"{server.data_dir.name}.server.log"
    kind = runtime.get("snapshot_kind", "?")
    print(f"{count} sandboxes x {rounds} rounds; snapshot kind: {kind} {runtime.get('criu_version', '')}".rstrip())
    print(row("baseline: first byte, running sandbox", baseline))
    print(row("first byte, frozen (idle-paused) sandbox", frozen))
    print(row(f"first byte, snapshotted sandbox ({kind})", snapshot))
    print(row("server: freeze (running->paused)", logged(log, "running", "paused")))
    print(row("server: thaw (paused->running)", logged(log, "paused", "running")))
    print(row(f"server: snapshot (running|paused->snapshotted, {kind})", logged(log, "running|paused", "snapshotted")))
    print(row(f"server: restore (snapshotted->running, {kind})", logged(log, "snapshotted", "running")))
    print(row("client: E2B pause call, end to end", pause_calls))
    print(f"{'memory per frozen sandbox (cgroup usage)':<44} p50 {percentile(frozen_mem, 50):7.1f} MiB  "
          f"(counter server with an 8 MiB heap; a snapshotted sandbox keeps 0)")  # fmt: skip
    b, f, s = (percentile(v, 50) for v in (baseline, frozen, snapshot))
    print(f"p50 ratios to the baseline: frozen {f / b:.1f}x, snapshotted {s / b:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sandboxes", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp,
        running_server(Path(tmp) / "data", "--pause-after", "1", "--snapshot-after", "0") as server,
    ):
        os.environ.update(server.e2b_env())
        run(server, args.sandboxes, args.rounds)


if __name__ == "__main__":
    main()
