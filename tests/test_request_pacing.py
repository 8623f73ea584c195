"""Each API key's requests are paced (`activator._pacing`): a burst of twice the rate goes at once, the next ones
wait their turn, one whose turn is too far off gets 429 + Retry-After, and other keys never wait for it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from activator import RequestPacer, TooManyRequests
from tests.server_fixtures import server_in_temp_dir
from tests.ui_fixtures import new_key

pytestmark = pytest.mark.anyio


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(round(seconds, 6))


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


async def test_a_burst_of_twice_the_rate_goes_at_once_and_the_next_waits_its_turn(clock: _Clock) -> None:
    pacer = RequestPacer(10, clock=clock, sleep=clock.sleep)
    for _ in range(20):
        await pacer.admit("a")
    assert clock.waits == []
    await pacer.admit("a")
    await pacer.admit("a")
    assert clock.waits == [0.1, 0.2]
    await pacer.admit("b")  # another key has its own pace
    assert clock.waits == [0.1, 0.2]


async def test_a_turn_too_far_off_is_refused_with_when_to_come_back(clock: _Clock) -> None:
    pacer = RequestPacer(10, max_wait=1.0, clock=clock, sleep=clock.sleep)
    for _ in range(30):  # 20 at once, then 10 waiting up to a second
        await pacer.admit("a")
    with pytest.raises(TooManyRequests) as refused:
        await pacer.admit("a")
    assert refused.value.status_code == 429
    assert refused.value.retry_after == 2
    waited = len(clock.waits)
    clock.now += 3.0  # the queue has drained
    await pacer.admit("a")
    assert len(clock.waits) == waited  # at once


async def test_a_key_that_paused_gets_its_burst_back_and_zero_turns_pacing_off(clock: _Clock) -> None:
    pacer = RequestPacer(10, clock=clock, sleep=clock.sleep)
    for _ in range(20):
        await pacer.admit("a")
    clock.now += 60
    for _ in range(20):
        await pacer.admit("a")
    assert clock.waits == []
    off = RequestPacer(0, clock=clock, sleep=clock.sleep)
    for _ in range(10_000):
        await off.admit("a")
    assert clock.waits == []


def test_a_server_paces_each_key_and_answers_a_turn_too_far_off_in_e2b_shape(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """With `--key-request-rate 1` (bursts of 2, waits up to 10 s), 20 requests of one key sent at once: the first
    ones are answered, those whose turn is over 10 s away get 429 + Retry-After in E2B's shape, and another key's
    request meanwhile is answered, not refused."""
    with server_in_temp_dir(tmp_path_factory, "pacing", "--key-request-rate", "1") as server:
        other = new_key(server, "unhurried")

        async def flood() -> tuple[list[httpx.Response], httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                mine = [client.get("/sandboxes", headers={"X-API-Key": server.api_key}) for _ in range(20)]
                theirs = client.get("/sandboxes", headers={"X-API-Key": other})
                *answers, answer = await asyncio.gather(*mine, theirs)
                return answers, answer

        answers, theirs = asyncio.run(flood())
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses.count(200) >= 2
    assert 429 in statuses
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert int(refused.headers["Retry-After"]) > 0
    assert refused.json()["code"] == 429
    assert "retry in" in refused.json()["message"]
    assert theirs.status_code == 200
