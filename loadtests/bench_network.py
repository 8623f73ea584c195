"""Benchmark: what sandbox egress costs, local runtime, against the host in the same run.

Prints, in one run:

- cold start (`runtime.start`) to a ready executor, and the part of it that sets up networking (the route,
  the nftables table and the host's sockets in the sandbox's namespace: `Egress.attach`);
- a cold start without egress (what the warm pool starts), then `set_egress` with internet on it: what a warm
  claim adds when it applies the caller's rules; and `set_egress` replacing rules (E2B's `update_network`);
- requests and throughput from a sandbox (through the host's egress proxy) and from the host itself, to the
  same HTTP server in a test internet namespace (`tests.internet_fixtures`): curl's time for one small GET
  on a new connection, and the speed of a 64 MiB download.

Nothing leaves the machine. Run as root:

    .venv/bin/python -m loadtests.bench_network --runs 30
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from loadtests._stats import percentile, row
from pool import ALL_TRAFFIC, EgressRules, EgressSettings, LocalRuntime
from tests.internet_fixtures import DNS_SERVER, WEB_IP, made_internet
from tests.runtime_fixtures import local_runtime, spec
from tests.sandbox_exec import run_in_sandbox

INTERNET, ALL_OFF = EgressRules(), EgressRules(deny_out=ALL_TRAFFIC)
SMALL = f"http://{WEB_IP}/"
BIG = f"http://{WEB_IP}/big"
_LATENCY = "for i in $(seq {n}); do curl -s -o /dev/null -w '%{{time_total}}\\n' {url}; done"
_SPEED = "curl -s -o /dev/null -w '%{{speed_download}}\\n' {url}"


def _timed_attach(rt: LocalRuntime, sink: dict[str, list[float]]) -> None:
    """Record how long each `Egress.attach` of `rt` takes, per sandbox (starts and `set_egress` alike)."""
    attach = rt._egress.attach

    async def timed(sandbox_id: str, netns_fd: int, rules: EgressRules, *, fresh: bool = False) -> None:
        began = time.perf_counter()
        await attach(sandbox_id, netns_fd, rules, fresh=fresh)
        sink.setdefault(sandbox_id, []).append((time.perf_counter() - began) * 1000)

    rt._egress.attach = timed  # type: ignore[method-assign]


async def _ms(call: Awaitable[object]) -> float:
    began = time.perf_counter()
    await call
    return (time.perf_counter() - began) * 1000


async def _measure(runs: int, data_dir: Path) -> None:
    async with local_runtime(data_dir, egress=EgressSettings(dns_servers=(DNS_SERVER,))) as rt:
        await rt.stop(await _start(rt, "warmup"))  # the one-time set-up (libnftables, threads) is paid here
        starts: list[float] = []
        offline: list[float] = []
        claims: list[float] = []
        updates: list[float] = []
        attaches: dict[str, list[float]] = {}
        _timed_attach(rt, attaches)
        only_web = EgressRules(allow_out=(f"{WEB_IP}/32",), deny_out=ALL_TRAFFIC)
        for i in range(runs):
            starts.append(await _ms(_start(rt, f"online{i}")))
            offline.append(await _ms(_start(rt, f"warm{i}", ALL_OFF)))
            claims.append(await _ms(rt.set_egress(f"warm{i}", EgressRules())))
            updates.append(await _ms(rt.set_egress(f"warm{i}", only_web)))
            await rt.stop(f"online{i}")
            await rt.stop(f"warm{i}")
        print(row("cold start with internet (executor ready)", starts))
        print(row("  of which networking (Egress.attach)", [attaches[f"online{i}"][0] for i in range(runs)]))
        print(row("cold start without egress (warm pool's)", offline))
        print(row("warm claim: set_egress on that sandbox", claims))
        print(row("update_network: set_egress replacing rules", updates))
        box = await _start(rt, "traffic")
        inside = await _curl_numbers(lambda cmd: _in_sandbox(rt, box, cmd), runs)
        host = await _curl_numbers(_on_host, runs)
        print(row("GET on a new connection, host", host[0]))
        print(row("GET on a new connection, sandbox", inside[0]))
        for name, speeds in (("host", host[1]), ("sandbox", inside[1])):
            print(f"{'64 MiB download, ' + name:<44} p50 {percentile(speeds, 50):7.0f} MB/s  n={len(speeds)}")
        ratio = percentile(inside[1], 50) / percentile(host[1], 50)
        print(f"{'sandbox / host throughput (p50)':<44} {ratio:.2f}")


async def _start(rt: LocalRuntime, sandbox_id: str, rules: EgressRules = INTERNET) -> str:
    await rt.start(msgspec.structs.replace(spec(sandbox_id), egress=rules))
    return sandbox_id


async def _in_sandbox(rt: LocalRuntime, sandbox_id: str, command: str) -> str:
    return (await run_in_sandbox(rt, sandbox_id, command)).stdout


async def _on_host(command: str) -> str:
    done = await asyncio.to_thread(subprocess.run, ["bash", "-c", command], capture_output=True, text=True)
    return done.stdout


async def _curl_numbers(run: Callable[[str], Awaitable[str]], runs: int) -> tuple[list[float], list[float]]:
    """curl's small-GET times (ms) and 64 MiB download speeds (MB/s), as `run` executes them."""
    latency = await run(_LATENCY.format(n=runs, url=SMALL))
    speeds = [await run(_SPEED.format(url=BIG)) for _ in range(max(3, runs // 5))]
    return [float(x) * 1000 for x in latency.split()], [float(s) / 1e6 for s in speeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-network-", dir="/var/tmp") as tmp, made_internet(Path(tmp)):
        asyncio.run(_measure(args.runs, Path(tmp) / "data"))


if __name__ == "__main__":
    main()
