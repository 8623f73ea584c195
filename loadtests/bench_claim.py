"""Benchmark: creating a sandbox from a warm pool against a cold start, local runtime, same run.

Each round measures, in turn and on the same runtime:

- warm claim: `WarmPools.claim()` (pop + `POST /init` with env vars and a token) until the executor answers /health;
- warm claim + first command: the claim, then `echo hi` through the executor's process API;
- cold start + first command (the baseline): `runtime.start()` with the same init, then `echo hi`;
- the same while another cold start runs: what two creates close together cost without any pool;
- drained pool, refill idle: `claim()` answers None, then the cold start + `echo hi` the caller falls back to;
- drained by a burst: the same, right after a burst of claims emptied the pool (the refills wait for it);
- miss during refills: the same, once the refills that followed the burst are starting (the worst case);
- the miss alone: what `claim()` costs when it answers None.

Warm and cold rounds start with the pool full and no refill in flight, so each figure is one create on an
otherwise idle machine; the refill a claim triggers runs during its first command, as it would in service.
Run as root:

    .venv/bin/python -m loadtests.bench_claim --runs 40
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from activator._records import new_sandbox_id
from executor.envd import ENVD_PORT
from loadtests._stats import percentile, row
from pool import ExecutorInit, LocalRuntime, SandboxSpec
from pool._warm import WarmPools
from tests.runtime_fixtures import TEMPLATES, local_runtime
from tests.sandbox_exec import run_in_sandbox

TEMPLATE = TEMPLATES["base"]
TOKEN = "bench-token"
INIT = ExecutorInit(
    env_vars={"GREETING": "hi"}, access_token=TOKEN, default_user=TEMPLATE.user, default_workdir=TEMPLATE.workdir
)
Series = dict[str, list[float]]
SCENARIOS = ("warm", "warm+cmd", "cold+cmd", "cold-pair", "drained-idle", "after-burst", "during-refill", "miss")


async def _health(runtime: LocalRuntime, sandbox_id: str) -> None:
    reader, writer = await asyncio.open_connection(sock=await runtime.open_socket(sandbox_id, ENVD_PORT))
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status = await reader.readline()
    writer.close()
    assert status.split()[1] == b"204", status


async def _first_command(runtime: LocalRuntime, sandbox_id: str) -> None:
    result = await run_in_sandbox(runtime, sandbox_id, "echo $GREETING", token=TOKEN)
    assert result.stdout == "hi\n", result


async def _settled(pools: WarmPools) -> None:
    """Wait until the pool is full and no refill is starting: the state a create finds between bursts."""
    async with asyncio.timeout(60):
        while (stats := pools.stats()["base"]).ready < stats.target or stats.starting:
            await pools.changed()


async def _refilling(pools: WarmPools) -> None:
    """Wait until refills are starting after a burst (they wait `refill_delay` after the last claim)."""
    async with asyncio.timeout(60):
        while not pools.stats()["base"].starting:
            await pools.changed()


async def _timed(work: Callable[[], Awaitable[str]], into: list[float]) -> str:
    began = time.perf_counter()
    sandbox_id = await work()
    into.append((time.perf_counter() - began) * 1000)
    return sandbox_id


class _Round:
    """One round of every measurement; each sandbox it creates is stopped before the next measurement."""

    def __init__(self, runtime: LocalRuntime, pools: WarmPools, series: Series) -> None:
        self.runtime, self.pools, self.series = runtime, pools, series

    async def claim(self, then: Callable[[LocalRuntime, str], Awaitable[None]]) -> str:
        sandbox_id = await self.pools.claim("base", INIT)
        assert sandbox_id is not None, "the pool was settled full"
        await then(self.runtime, sandbox_id)
        return sandbox_id

    async def create(self) -> str:
        """What `Activator.create` does: a claim, and a cold start when it answers None."""
        began = time.perf_counter()
        sandbox_id = await self.pools.claim("base", INIT)
        self.series["miss"].append((time.perf_counter() - began) * 1000)
        if sandbox_id is None:
            sandbox_id = new_sandbox_id()
            await self.runtime.start(SandboxSpec(sandbox_id=sandbox_id, template=TEMPLATE, init=INIT))
        await _first_command(self.runtime, sandbox_id)
        return sandbox_id

    async def cold(self) -> str:
        sandbox_id = new_sandbox_id()
        await self.runtime.start(SandboxSpec(sandbox_id=sandbox_id, template=TEMPLATE, init=INIT))
        await _first_command(self.runtime, sandbox_id)
        return sandbox_id

    async def cold_pair(self) -> str:
        """A timed cold start begun while another (untimed) one runs, as in a burst with no pool."""
        other = asyncio.create_task(self.cold())
        await asyncio.sleep(0)  # let the other start begin first
        try:
            return await _timed(self.cold, self.series["cold-pair"])
        finally:
            await self.runtime.stop(await other)

    async def drain(self) -> list[str]:
        """Claim every ready sandbox at once (a burst), which leaves the pool empty and its refills starting."""
        taken = await asyncio.gather(*(self.pools.claim("base", INIT) for _ in range(self.pools.stats()["base"].ready)))
        return [sandbox_id for sandbox_id in taken if sandbox_id is not None]

    async def run(self, idle_pools: WarmPools) -> None:
        s = self.series
        steps: list[tuple[str, Callable[[], Awaitable[str]]]] = [
            ("warm", lambda: self.claim(_health)),
            ("warm+cmd", lambda: self.claim(_first_command)),
            ("cold+cmd", self.cold),
            ("drained-idle", lambda: _Round(self.runtime, idle_pools, s).create()),
        ]
        for name, work in steps:
            await _settled(self.pools)
            await self.runtime.stop(await _timed(work, s[name]))
        await _settled(self.pools)
        await self.runtime.stop(await self.cold_pair())
        for name in ("after-burst", "during-refill"):
            await _settled(self.pools)
            burst = await self.drain()
            if name == "during-refill":
                await _refilling(self.pools)
            await self.runtime.stop(await _timed(self.create, s[name]))
            await asyncio.gather(*(self.runtime.stop(sandbox_id) for sandbox_id in burst))


async def _measure(runs: int, target: int, max_starting: int, data_dir: Path) -> Series:
    series: Series = {name: [] for name in SCENARIOS}
    async with local_runtime(data_dir) as runtime:
        pools = WarmPools(
            runtime, TEMPLATES, new_id=new_sandbox_id, targets={"base": target}, max_starting=max_starting
        )
        idle_pools = WarmPools(runtime, TEMPLATES, new_id=new_sandbox_id, targets={"base": target})  # never run
        refill = asyncio.create_task(pools.run())
        try:
            await _Round(runtime, pools, {name: [] for name in series}).run(idle_pools)  # warm-up, not counted
            for _ in range(runs):
                await _Round(runtime, pools, series).run(idle_pools)
        finally:
            await pools.close()
            await refill
    return series


def _report(series: Series, target: int, max_starting: int) -> None:
    baseline = percentile(series["cold+cmd"], 50)
    labels = {
        "cold+cmd": "BASELINE cold start + first command",
        "cold-pair": "cold start + first cmd beside another start",
        "warm": "warm claim -> executor answers",
        "warm+cmd": "warm claim + first command",
        "drained-idle": "drained pool (refill idle) + first command",
        "after-burst": "pool drained by a burst, create + first cmd",
        "during-refill": f"create + first cmd while {min(target, max_starting)} refill(s) start",
        "miss": "claim on an empty pool (answers None)",
    }
    print(f"warm pool target {target}, max_starting {max_starting}, template base; ratio = p50 / baseline p50")
    for name, label in labels.items():
        print(f"{row(label, series[name])}  x{percentile(series[name], 50) / baseline:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--target", type=int, default=2, help="warm sandboxes kept ready (default 2)")
    parser.add_argument("--max-starting", type=int, default=1, help="refills at once (WarmPools' default: 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-claim-") as tmp:
        series = asyncio.run(_measure(args.runs, args.target, args.max_starting, Path(tmp)))
    _report(series, args.target, args.max_starting)


if __name__ == "__main__":
    main()
