"""Warm pools against a real local runtime: filling, claiming with the caller's init, refilling, falling back."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import pytest
from msgspec.structs import replace

from activator._records import new_sandbox_id
from pool import ExecutorInit, LocalRuntime
from pool._templates import AptLayer
from pool._warm import WarmPools, WarmRuntime
from tests.runtime_fixtures import TEMPLATES, local_runtime
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

BASE = TEMPLATES["base"]
# A template whose extra layer was never built: every start fails with "template 'unbuilt' is not built".
UNBUILT = replace(BASE, name="unbuilt", layers=(*BASE.layers, AptLayer(packages=["no-such-package-xyz"])))

Scenario = Callable[[LocalRuntime], Awaitable[None]]


async def _run(tmp_path: Path, scenario: Scenario) -> None:
    async with local_runtime(tmp_path) as runtime:
        await scenario(runtime)


@asynccontextmanager
async def _refilling(
    runtime: WarmRuntime, targets: dict[str, int], *, max_starting: int = 1, backoff: tuple[float, float] = (0.5, 30.0)
) -> AsyncIterator[WarmPools]:
    """Pools whose refill runs for the block, closed (and every unclaimed sandbox stopped) after it."""
    templates = {"base": BASE, "unbuilt": UNBUILT}
    pools = WarmPools(
        runtime, templates, new_id=new_sandbox_id, targets=targets, max_starting=max_starting, backoff=backoff
    )
    refill = asyncio.create_task(pools.run())
    try:
        yield pools
    finally:
        await pools.close()
        async with asyncio.timeout(5):
            await refill


async def _until(pools: WarmPools, check: Callable[[], bool], what: str, deadline: float = 30.0) -> None:
    """Wait for `check` to hold, re-checking at every change of the pools; fail with `what` past `deadline`."""
    try:
        async with asyncio.timeout(deadline):
            while not check():
                await pools.changed()
    except TimeoutError:
        pytest.fail(f"not within {deadline} s: {what}; pools: {pools.stats()}")


async def _full(pools: WarmPools, template: str = "base") -> None:
    stats = pools.stats
    await _until(pools, lambda: stats()[template].ready == stats()[template].target, f"{template} pool full")


async def _status(runtime: LocalRuntime, sandbox_id: str, path: str, token: str | None = None) -> int:
    """The status code the executor answers GET `path` with."""
    reader, writer = await asyncio.open_connection(sock=await runtime.open_socket(sandbox_id, 49983))
    auth = f"X-Access-Token: {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
    status = await reader.readline()
    writer.close()
    return int(status.split()[1])


async def test_pool_fills_to_its_target_with_sandbox_ids_and_stops_there(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 3}) as pools:
            await _full(pools)
            stats = pools.stats()["base"]
            assert (stats.starting, stats.refilled, stats.claims) == (0, 3, 0)
            assert len(rt.sandbox_ids()) == 3
            assert all(re.fullmatch(r"[a-z0-9]{20}", sandbox_id) for sandbox_id in rt.sandbox_ids())
            assert pools.stats()["unbuilt"].target == 0  # no override, and the template's own `warm` is 0

    await _run(tmp_path, scenario)


async def test_claim_applies_env_vars_and_token_to_the_running_sandbox(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 2}) as pools:
            await _full(pools)
            pids = {sandbox_id: rt.host_pid(sandbox_id) for sandbox_id in rt.sandbox_ids()}
            init = ExecutorInit(env_vars={"FOO": "from-the-caller"}, access_token="tok123", default_user="user")
            sandbox_id = await pools.claim("base", init)
            assert sandbox_id in pids
            assert rt.host_pid(sandbox_id) == pids[sandbox_id]  # same executor: applied, not restarted
            echoed = await run_in_sandbox(rt, sandbox_id, "echo $FOO", token="tok123")
            assert echoed.stdout.strip() == "from-the-caller"
            assert await _status(rt, sandbox_id, "/envs") == 401
            assert await _status(rt, sandbox_id, "/envs", token="wrong") == 401
            assert await _status(rt, sandbox_id, "/envs", token="tok123") == 200

    await _run(tmp_path, scenario)


async def test_pool_refills_after_a_claim(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 1}) as pools:
            await _full(pools)
            claimed = await pools.claim("base", ExecutorInit())
            assert claimed is not None
            await _until(pools, lambda: pools.stats()["base"].refilled == 2, "a refill after the claim")
            await _full(pools)
            assert set(rt.sandbox_ids()) - {claimed}, "the refill is a new sandbox"
            assert pools.stats()["base"].claims == 1

    await _run(tmp_path, scenario)


async def test_claims_past_the_target_return_none_and_the_pool_recovers(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 2}) as pools:
            await _full(pools)
            # Claims pop before their first await, so the third finds the pool empty: refills take far longer.
            first, second, third = await asyncio.gather(*(pools.claim("base", ExecutorInit()) for _ in range(3)))
            assert first is not None
            assert second not in (None, first)
            assert third is None
            assert (pools.stats()["base"].claims, pools.stats()["base"].misses) == (2, 1)
            await _full(pools)
            assert await pools.claim("base", ExecutorInit()) is not None
            assert await pools.claim("nosuchtemplate", ExecutorInit()) is None

    await _run(tmp_path, scenario)


async def test_a_miss_holds_refills_back_while_the_caller_cold_starts(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 1}) as pools:
            await _full(pools)  # also measures how long a start takes, which is how long a miss holds refills
            hit, miss = await asyncio.gather(*(pools.claim("base", ExecutorInit()) for _ in range(2)))
            assert hit is not None
            assert miss is None
            assert pools.stats()["base"].starting == 0, "the refill the hit asked for waits for the cold start"
            await _full(pools)

    await _run(tmp_path, scenario)


async def test_concurrent_claims_never_share_a_sandbox(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 3}) as pools:
            got: list[str | None] = []
            for _ in range(3):  # three rounds: full pool, then whatever the refill has ready meanwhile
                await _full(pools)
                got += await asyncio.gather(*(pools.claim("base", ExecutorInit()) for _ in range(8)))
            claimed = [sandbox_id for sandbox_id in got if sandbox_id is not None]
            assert len(claimed) >= 9
            assert len(set(claimed)) == len(claimed)
            assert set(claimed) <= set(rt.sandbox_ids())

    await _run(tmp_path, scenario)


async def test_a_dead_warm_sandbox_is_stopped_and_the_next_one_claimed(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 2}, max_starting=1) as pools:
            await _full(pools)
            oldest = rt.sandbox_ids()[0]  # one start at a time, so the runtime's order is the pool's; oldest first
            await rt.stop(oldest)  # its processes are gone, the pool does not know yet
            claimed = await pools.claim("base", ExecutorInit())
            assert claimed not in (None, oldest)
            assert pools.stats()["base"].discarded == 1

    await _run(tmp_path, scenario)


async def test_close_stops_every_unclaimed_sandbox_and_keeps_the_claimed_ones(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        async with _refilling(rt, {"base": 2}) as pools:
            await _full(pools)
            claimed = await pools.claim("base", ExecutorInit())
            await _until(pools, lambda: pools.stats()["base"].starting == 1, "a refill in flight")
        # `_refilling` closed the pools with that refill still starting.
        assert rt.sandbox_ids() == [claimed]
        assert await pools.claim("base", ExecutorInit()) is None

    await _run(tmp_path, scenario)


async def test_failing_refills_back_off_and_do_not_hold_up_other_templates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with _refilling(rt, {"base": 1, "unbuilt": 1}, backoff=(0.05, 0.2)) as pools:
            await _until(pools, lambda: pools.stats()["unbuilt"].failures >= 5, "five failed refills")
            elapsed = loop.time() - began
            await _full(pools)
        # Waits of 0.05, 0.1, 0.2 and 0.2 s lie between five failures: no busy loop.
        assert elapsed >= 0.55
        assert "warm pool unbuilt: starting a sandbox failed" in caplog.text
        assert "is not built" in caplog.text

    caplog.set_level(logging.WARNING, logger="pool.warm")
    await _run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ({"nope": 1}, "unknown template(s) 'nope'; known templates: base"),
        ({"base": -1}, "between 0 and 1000, not base=-1"),
        ({"base": 1001}, "between 0 and 1000, not base=1001"),
    ],
)
def test_invalid_targets_fail_at_construction(targets: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        WarmPools(cast(WarmRuntime, None), {"base": BASE}, new_id=new_sandbox_id, targets=targets)
