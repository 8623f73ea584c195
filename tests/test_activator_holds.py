"""HoldGate: a cap, a deadline and client departures bound every hold; the wake-up is never cancelled by one."""

from __future__ import annotations

import asyncio

import pytest

from activator import CLIENT_GONE, ClientGone, HoldQueueFull, HoldTimeout, Telemetry
from activator._holds import HoldGate

pytestmark = pytest.mark.anyio


def gate(max_held: int = 10, deadline: float = 5.0) -> tuple[HoldGate, Telemetry]:
    telemetry = Telemetry()
    return HoldGate(max_held=max_held, deadline=deadline, telemetry=telemetry), telemetry


async def test_every_holder_gets_the_wake_ups_result() -> None:
    holds, telemetry = gate()
    wake: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    waiting = asyncio.gather(*(holds.hold(wake) for _ in range(5)))
    await asyncio.sleep(0)
    assert holds.held == 5
    wake.set_result("up")
    assert await waiting == ["up"] * 5
    assert (holds.held, telemetry.holds) == (0, {"resumed": 5})


async def test_past_the_cap_a_request_fails_at_once() -> None:
    holds, telemetry = gate(max_held=1)
    wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first = asyncio.create_task(holds.hold(wake))
    await asyncio.sleep(0)
    with pytest.raises(HoldQueueFull):
        await holds.hold(wake)
    wake.set_result(None)
    await first
    assert telemetry.holds == {"queue_full": 1, "resumed": 1}


async def test_the_deadline_ends_the_hold_but_not_the_wake_up() -> None:
    holds, telemetry = gate(deadline=0.01)
    wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises(HoldTimeout):
        await holds.hold(wake)
    assert not wake.cancelled()
    assert telemetry.holds == {"timeout": 1}


async def test_a_departed_client_is_released_before_the_wake_up() -> None:
    holds, telemetry = gate()
    wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    gone = asyncio.Event()
    CLIENT_GONE.set(gone.wait)
    holding = asyncio.create_task(holds.hold(wake))
    await asyncio.sleep(0)
    gone.set()
    with pytest.raises(ClientGone):
        await holding
    assert not wake.done()
    assert telemetry.holds == {"client_gone": 1}


async def test_a_failed_wake_up_fails_every_holder() -> None:
    holds, telemetry = gate()
    wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.gather(*(holds.hold(wake) for _ in range(2)), return_exceptions=True)
    await asyncio.sleep(0)
    wake.set_exception(RuntimeError("restore failed"))
    assert [type(e) for e in await waiting] == [RuntimeError, RuntimeError]
    assert telemetry.holds == {"failed": 2}


def test_bounds_are_checked_on_construction() -> None:
    with pytest.raises(ValueError, match="max_held"):
        HoldGate(max_held=0, deadline=1)
    with pytest.raises(ValueError, match="deadline"):
        HoldGate(max_held=1, deadline=0)
