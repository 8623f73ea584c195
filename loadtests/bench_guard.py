"""Benchmark: what a sandbox pod's egress guard costs, against the same namespace without it, in one run.

In a network namespace made as a pod's (`tests.egress_guard_fixtures`, routed into the test internet of
`tests.internet_fixtures`), prints:

- the guard's start until it listens (the table in place: what its startup probe waits for);
- putting rules in force (`put_rules`: the nonce, the signed rules, the table replaced), which the gateway does
  at every create, warm claim, resume and `update_network`;
- one small GET on a new connection and a 64 MiB download, through the guard and from the bare namespace (the
  pod's own network, no guard): curl's time and speed, and their ratio.

Nothing leaves the machine. Run as root:

    .venv/bin/python -m loadtests.bench_guard --runs 20
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from loadtests._stats import percentile, row
from pool import EgressRules
from tests.egress_guard_fixtures import Pod, made_pod
from tests.internet_fixtures import WEB_IP, made_internet

SMALL, BIG = f"http://{WEB_IP}/", f"http://{WEB_IP}/big"


def _curl(pod: Pod, url: str, field: str) -> float:
    result = pod.run("curl", "-s", "-o", "/dev/null", "-w", f"%{{{field}}}", url, timeout=120)
    assert result.returncode == 0, result
    return float(result.stdout)


def _traffic(pod: Pod, runs: int) -> tuple[list[float], list[float]]:
    latency = [_curl(pod, SMALL, "time_total") * 1000 for _ in range(runs)]
    speed = [_curl(pod, BIG, "speed_download") / 2**20 for _ in range(max(runs // 4, 3))]
    return latency, speed


async def _put_times(pod: Pod, runs: int) -> list[float]:
    times = []
    for i in range(runs):
        rules = EgressRules(deny_out=(f"198.51.100.{i % 200}/32",))
        started = time.perf_counter()
        await pod.put(rules)
        times.append((time.perf_counter() - started) * 1000)
    await pod.put(EgressRules())
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as work, made_internet(Path(work)) as net, made_pod(net, Path(work)) as pod:
        bare_latency, bare_speed = _traffic(pod, runs)
        starts = []
        for _ in range(max(runs // 4, 3)):
            started = time.perf_counter()
            pod.start_guard()
            starts.append((time.perf_counter() - started) * 1000)
            pod.stop_guard()
        pod.start_guard()
        puts = asyncio.run(_put_times(pod, runs))
        guarded_latency, guarded_speed = _traffic(pod, runs)
    print(row("guard start until it listens", starts))
    print(row("rules put in force (put_rules)", puts))
    print(row("GET, new connection, bare namespace", bare_latency))
    print(row("GET, new connection, through the guard", guarded_latency))
    for label, speeds in (("bare namespace", bare_speed), ("through the guard", guarded_speed)):
        name = f"64 MiB download, {label}"
        print(f"{name:<44} p50 {percentile(speeds, 50):7.0f} MiB/s  min {min(speeds):6.0f} MiB/s")
    ratio = percentile(guarded_speed, 50) / percentile(bare_speed, 50)
    print(f"throughput through the guard / bare, p50: {ratio:.2f}")


if __name__ == "__main__":
    main()
