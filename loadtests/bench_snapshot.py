"""Benchmark: snapshot to zero and back, local runtime, both kinds (CRIU and files only).

One sandbox whose template starts an HTTP server holding a --heap-mib heap (default 30) goes around the
idle cycle --runs times: freeze (paused), snapshot, restore, first HTTP 200 from the server. Printed next
to the baseline of the same run, a cold start of the same template until its port answers. Memory is the
sandbox's cgroup while paused; snapshotted, the sandbox has no process and no cgroup left. Run as root:

    .venv/bin/python -m loadtests.bench_snapshot --runs 20 [--heap-mib 0]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import msgspec

from loadtests._stats import row
from pool import ExecutorInit, LocalRuntime, SandboxSpec
from tests.runtime_fixtures import TEMPLATES, http_get, local_runtime

_SERVER = (
    "exec python3 -c 'import http.server, os\n"
    "heap = os.urandom(1 << 20) * {heap}\n"
    'http.server.ThreadingHTTPServer(("127.0.0.1", 8008), http.server.SimpleHTTPRequestHandler).serve_forever()\''
)


def _spec(sandbox_id: str, heap_mib: int) -> SandboxSpec:
    template = msgspec.structs.replace(TEMPLATES["base"], start=(_SERVER.format(heap=heap_mib),), ports=(8008,))
    return SandboxSpec(sandbox_id=sandbox_id, template=template, init=ExecutorInit(default_user="user"))


class _Figures(msgspec.Struct):
    cold: list[float] = []
    snapshot: list[float] = []
    restore: list[float] = []
    paused_mib: list[float] = []
    image_mib: list[float] = []


async def _cycle(rt: LocalRuntime, spec: SandboxSpec, figures: _Figures) -> None:
    await rt.freeze("bench")
    figures.paused_mib.append((await rt.stats("bench")).mem_used / 2**20)
    began = time.perf_counter()
    info = await rt.snapshot("bench")
    figures.snapshot.append((time.perf_counter() - began) * 1000)
    figures.image_mib.append(info.image_bytes / 2**20)
    began = time.perf_counter()
    await rt.restore(spec)
    await http_get(rt, "bench", 8008)
    figures.restore.append((time.perf_counter() - began) * 1000)


async def _measure(runs: int, heap_mib: int, data_dir: Path, *, criu: bool) -> tuple[str, _Figures]:
    figures = _Figures()
    async with local_runtime(data_dir, criu=criu) as rt:
        for i in range(runs):
            began = time.perf_counter()
            await rt.start(_spec(f"cold{i}", heap_mib))
            await http_get(rt, f"cold{i}", 8008)
            figures.cold.append((time.perf_counter() - began) * 1000)
            await rt.stop(f"cold{i}")
        spec = _spec("bench", heap_mib)
        await rt.start(spec)
        for _ in range(runs):
            await _cycle(rt, spec, figures)
        kind = rt.capabilities().snapshot_kind
    return kind, figures


def _report(kind: str, figures: _Figures) -> None:
    print(row(f"[{kind}] baseline: cold start -> first 200", figures.cold))
    print(row(f"[{kind}] snapshot of a paused sandbox", figures.snapshot))
    print(row(f"[{kind}] restore -> first 200", figures.restore))
    ratio = sorted(figures.restore)[len(figures.restore) // 2] / sorted(figures.cold)[len(figures.cold) // 2]
    print(f"[{kind}] restore p50 / cold start p50 = {ratio:.2f}")
    paused = sorted(figures.paused_mib)[len(figures.paused_mib) // 2]
    image = sorted(figures.image_mib)[len(figures.image_mib) // 2]
    print(f"[{kind}] memory: paused {paused:.1f} MiB (cgroup), snapshotted 0 MiB (no cgroup); disk {image:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--heap-mib", type=int, default=30, help="memory the sandbox's server holds")
    args = parser.parse_args()
    for criu in (True, False):
        with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
            _report(*asyncio.run(_measure(args.runs, args.heap_mib, Path(tmp), criu=criu)))


if __name__ == "__main__":
    main()
