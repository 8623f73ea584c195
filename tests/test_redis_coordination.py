"""Gateway replicas coordinating through a real Redis server: locks, change notices, activity, Redis down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from activator import RedisCoordinator
from tests import redis_fixtures
from tests.polling import wait_for_async
from tests.redis_fixtures import RedisServer
from tests.server_fixtures import REPO

redis_server = redis_fixtures.redis_server

pytestmark = pytest.mark.timeout(60)

UNREACHABLE = "unreachable: coordinating alone until it is back"
BACK = "is back: coordinating with the other replicas again"


@contextlib.asynccontextmanager
async def replica(url: str, name: str, **options: Any) -> AsyncIterator[tuple[RedisCoordinator, asyncio.Queue[str]]]:
    """A started coordinator, and the queue of the change notices it heard from the others."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    coordinator = RedisCoordinator(url, replica_id=name, **options)
    await coordinator.start(heard.put_nowait)
    try:
        yield coordinator, heard
    finally:
        await coordinator.close()


async def lock_within(coordinator: RedisCoordinator, sandbox_id: str, seconds: float) -> bool:
    """Whether the lock could be taken (and was let go at once) within `seconds`."""
    try:
        async with asyncio.timeout(seconds), coordinator.sandbox_lock(sandbox_id):
            return True
    except TimeoutError:
        return False


def logged(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "activator.coordination" and text in r.getMessage()]


def test_lock_is_exclusive_and_a_waiter_gets_it_as_soon_as_it_is_released(redis_server: RedisServer) -> None:
    async def main() -> None:
        slow_polls = {"lock_retry": 10.0, "lock_retry_max": 10.0}  # only the release message can wake the waiter
        async with replica(redis_server.url, "a") as (a, _), replica(redis_server.url, "b", **slow_polls) as (b, _):
            async with a.sandbox_lock("s1"):
                waiter = asyncio.create_task(lock_within(b, "s1", 20.0))
                cpu, wall = time.process_time(), time.monotonic()
                await asyncio.sleep(1.0)
                assert not waiter.done()
                assert time.process_time() - cpu < 0.25 * (time.monotonic() - wall)  # waiting does not spin
                released = time.monotonic()
            assert await waiter
            assert time.monotonic() - released < 5.0  # the next poll would have been 10 s later

    asyncio.run(main())


def test_held_lock_outlives_its_ttl_because_it_is_renewed(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with replica(redis_server.url, "a", lock_ttl=0.6) as (a, _), replica(redis_server.url, "b") as (b, _):
            async with a.sandbox_lock("s1"):
                await asyncio.sleep(2.0)
                assert not await lock_within(b, "s1", 0.5)
            assert await lock_within(b, "s1", 1.0)

    asyncio.run(main())


_CRASHING_HOLDER = """
import asyncio, sys
from activator import RedisCoordinator

async def main() -> None:
    coordinator = RedisCoordinator(sys.argv[1], replica_id="doomed", lock_ttl=1.5)
    await coordinator.start(lambda _: None)
    async with coordinator.sandbox_lock("s1"):
        print("held", flush=True)
        await asyncio.sleep(60)

asyncio.run(main())
"""


def test_lock_of_a_crashed_holder_expires_after_its_ttl(redis_server: RedisServer) -> None:
    argv = [sys.executable, "-c", _CRASHING_HOLDER, redis_server.url]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, cwd=REPO) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == b"held\n"
        finally:
            holder.kill()
    crashed = time.monotonic()

    async def main() -> None:
        async with replica(redis_server.url, "b") as (b, _):
            assert await lock_within(b, "s1", 10.0)
            waited = time.monotonic() - crashed
            assert 0.8 < waited < 8.0, waited  # its 1.5 s TTL, renewed every 0.5 s until the kill, not held on

    asyncio.run(main())


def test_change_notices_reach_the_other_replicas_but_not_their_sender(redis_server: RedisServer) -> None:
    async def main() -> None:
        async with replica(redis_server.url, "a") as (a, heard_a), replica(redis_server.url, "b") as (b, heard_b):
            await a.publish_changed("s1")
            assert await asyncio.wait_for(heard_b.get(), 5) == "s1"
            await b.publish_changed("s2")
            assert await asyncio.wait_for(heard_a.get(), 5) == "s2"  # after its own "s1", in channel order
            assert heard_a.empty()
            assert heard_b.empty()

    asyncio.run(main())


def test_activity_goes_out_in_batches_and_the_newest_time_wins(redis_server: RedisServer) -> None:
    async def main() -> None:
        now = time.time()
        raw = aioredis.Redis.from_url(redis_server.url)
        try:
            async with (
                replica(redis_server.url, "a", flush_interval=3600) as (a, _),
                replica(redis_server.url, "b", flush_interval=0.2) as (b, _),
            ):
                await raw.config_resetstat()
                for i in range(50):
                    a.note_activity(f"s{i}", now + i)
                a.note_activity("s0", now - 100)  # older than what a saw: ignored
                assert "s3" not in await b.activity()  # nothing written per request
                b.note_activity("s1", now + 500)
                b.note_activity("s2", now - 100)

                async def a_sees_b() -> bool:
                    return (await a.activity()).get("s1") == now + 500

                await wait_for_async(a_sees_b, what="b's periodic flush")
                await a.close()  # its last flush
                assert await b.activity() == {f"s{i}": now + i for i in range(50)} | {"s1": now + 500}
                stats = await raw.info("commandstats")
                assert stats["cmdstat_hset"]["calls"] == 2  # one write per replica for all its sandboxes
        finally:
            await raw.aclose()

    asyncio.run(main())


def test_activity_older_than_the_retention_is_dropped(redis_server: RedisServer) -> None:
    async def main() -> None:
        now = time.time()
        options: dict[str, Any] = {"flush_interval": 0.1, "activity_retention": 60.0}
        async with replica(redis_server.url, "a", **options) as (a, _), replica(redis_server.url, "b") as (b, _):
            a.note_activity("old", now - 61)
            a.note_activity("new", now)

            async def b_sees_a() -> bool:
                return bool(await b.activity())

            await wait_for_async(b_sees_a, what="a's flush")
            assert await b.activity() == {"new": now}

    asyncio.run(main())


def test_coordination_goes_on_alone_while_redis_is_down(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="activator.coordination")

    async def main() -> None:
        async with replica(redis_server.url, "a") as (a, _), replica(redis_server.url, "b") as (b, _):
            redis_server.stop()
            began = time.monotonic()
            for coordinator in (a, b, a, b):
                async with coordinator.sandbox_lock("s1"):
                    assert not await lock_within(coordinator, "s1", 0.2)  # still exclusive in one process
                await coordinator.publish_changed("s1")
            a.note_activity("s1", time.time())
            assert list(await a.activity()) == ["s1"]
            assert await b.activity() == {}
            assert time.monotonic() - began < 6.0
            assert len(logged(caplog, UNREACHABLE)) == 2  # one line per replica
            assert f"redis at {redis_server.url} unreachable" in logged(caplog, UNREACHABLE)[0].getMessage()

    asyncio.run(main())


def test_coordination_resumes_when_redis_is_back(redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="activator.coordination")

    async def main() -> None:
        options: dict[str, Any] = {"reconnect_max": 0.5, "flush_interval": 0.2}
        async with (
            replica(redis_server.url, "a", **options) as (a, _),
            replica(redis_server.url, "b", **options) as (b, heard_b),
        ):
            redis_server.stop()
            await a.publish_changed("lost")
            await b.publish_changed("lost")
            noted = time.time()
            a.note_activity("s1", noted)  # while down: kept, and written once Redis is back
            assert not logged(caplog, BACK)  # so the wait below sees the reconnection, not an earlier line
            assert (await b.activity()).get("s1") != noted  # not written while Redis is down
            redis_server.start()

            async def both_back() -> bool:
                return len(logged(caplog, BACK)) == 2

            await wait_for_async(both_back, what="both replicas reconnecting")
            async with a.sandbox_lock("s1"):
                assert not await lock_within(b, "s1", 0.5)
            await a.publish_changed("s2")
            assert await asyncio.wait_for(heard_b.get(), 5) == "s2"

            async def b_sees_a() -> bool:
                return (await b.activity()).get("s1") == noted

            await wait_for_async(b_sees_a, what="a's activity written again")
            assert len(logged(caplog, UNREACHABLE)) == 2

    asyncio.run(main())


def test_starts_alone_when_redis_is_down_and_joins_once_it_is_up(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="activator.coordination")
    redis_server.stop()

    async def main() -> None:
        began = time.monotonic()
        async with replica(redis_server.url, "a", reconnect_max=0.5) as (a, _):
            assert time.monotonic() - began < 6.0
            assert len(logged(caplog, UNREACHABLE)) == 1
            assert await lock_within(a, "s1", 1.0)
            assert not logged(caplog, BACK)
            redis_server.start()

            async def joined() -> bool:
                return bool(logged(caplog, BACK))

            await wait_for_async(joined, what="the coordinator connecting")
            async with replica(redis_server.url, "b") as (b, _), a.sandbox_lock("s1"):
                assert not await lock_within(b, "s1", 0.5)

    asyncio.run(main())


def test_a_hung_redis_holds_no_call_longer_than_the_call_timeout(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with replica(redis_server.url, "a", call_timeout=2.0) as (a, _):
            redis_server.freeze()
            try:
                began = time.monotonic()
                async with a.sandbox_lock("s1"):
                    pass
                await a.publish_changed("s1")
                assert await a.activity() == {}
                assert time.monotonic() - began < 5.0  # the first call times out (2 s); all four would take 8 s
                assert len(logged(caplog, UNREACHABLE)) == 1
            finally:
                redis_server.thaw()

    asyncio.run(main())


def test_replica_ids_are_single_words() -> None:
    with pytest.raises(ValueError, match="replica id"):
        RedisCoordinator("redis://127.0.0.1:1/0", replica_id="two words")
