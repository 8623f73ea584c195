"""UI sessions shared by two gateway replicas through a real Redis: sign-in, sign-out and revocation on one are
seen on the other at once; idle and absolute expiry; the cap; Redis down (memory, this replica only)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from litestar import Litestar

from activator import ApiKeys, RedisCoordinator, SqliteStore
from gateway.ui import SharedSessionStore, UiServices, ui_router
from tests import redis_fixtures
from tests.polling import wait_for_async
from tests.redis_fixtures import RedisServer
from tests.test_activator_fakes import Clock, FakeRuntime, activator

redis_server = redis_fixtures.redis_server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@contextlib.asynccontextmanager
async def replica(url: str, name: str, **limits: Any) -> AsyncIterator[SharedSessionStore]:
    """The session store of one gateway replica, on its own started coordinator."""
    coordinator = RedisCoordinator(url, replica_id=name, call_timeout=0.3, reconnect_max=0.3)  # quick to notice
    await coordinator.start(lambda _: None)
    try:
        yield SharedSessionStore(coordinator, **limits)
    finally:
        await coordinator.close()


@contextlib.asynccontextmanager
async def raw(url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


def client_of(app: Litestar, origin: str) -> httpx.AsyncClient:
    """A client of the app on this test's own loop, where its replica's Redis connections live."""
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # Litestar's ASGI types are narrower
    return httpx.AsyncClient(transport=transport, base_url=origin, follow_redirects=True)


def key_of(session_id: str) -> str:
    return "agent-sandbox:ui-session:" + hashlib.sha256(session_id.encode()).hexdigest()


async def test_a_sign_in_on_one_replica_is_live_on_the_other(redis_server: RedisServer) -> None:
    async with replica(redis_server.url, "a") as a, replica(redis_server.url, "b") as b:
        token = await a.create("key1", "laptop")
        on_a, on_b = await a.get(token), await b.get(token)
        assert on_a is not None
        assert on_b is not None
        assert (on_b.owner, on_b.key_name, on_b.csrf) == ("key1", "laptop", on_a.csrf)
        assert len(a.local) == len(b.local) == 0  # nothing kept in memory while Redis is up


async def test_redis_holds_only_the_digest_of_a_session_id(redis_server: RedisServer) -> None:
    async with replica(redis_server.url, "a") as a, raw(redis_server.url) as client:
        token = await a.create("key1", "")
        assert await client.exists(key_of(token)) == 1
        stored = [key async for key in client.scan_iter("*")]
        values = [await client.get(key) for key in stored if await client.type(key) == "string"]
        members = [m for key in stored if await client.type(key) == "set" for m in await client.smembers(key)]
        assert not any(token in text for text in [*stored, *values, *members])


async def test_sign_out_on_one_replica_ends_the_session_on_the_other_at_once(redis_server: RedisServer) -> None:
    async with replica(redis_server.url, "a") as a, replica(redis_server.url, "b") as b:
        token, other = await a.create("key1", ""), await a.create("key1", "")
        assert await b.get(token) is not None
        await a.drop(token)
        assert await b.get(token) is None
        assert await a.get(token) is None
        assert await b.get(other) is not None


async def test_a_revoked_key_ends_all_its_sessions_on_every_replica(redis_server: RedisServer) -> None:
    async with replica(redis_server.url, "a") as a, replica(redis_server.url, "b") as b:
        revoked = [await a.create("key1", ""), await b.create("key1", ""), await b.create("key1", "")]
        kept = await a.create("key2", "")
        await b.drop_owner("key1")
        for token in revoked:
            assert await a.get(token) is None
            assert await b.get(token) is None
        assert await a.get(kept) is not None
        assert await b.get(kept) is not None


async def test_use_on_either_replica_moves_the_idle_expiry_and_idleness_ends_it(redis_server: RedisServer) -> None:
    clock = Clock()
    limits = {"lifetime": 1000.0, "idle": 60.0, "clock": clock}
    async with (
        replica(redis_server.url, "a", **limits) as a,
        replica(redis_server.url, "b", **limits) as b,
        raw(redis_server.url) as client,
    ):
        token = await a.create("key1", "")
        assert 59_000 < await client.pttl(key_of(token)) <= 60_000  # Redis expires it too
        clock.advance(59)
        assert await b.get(token) is not None
        clock.advance(59)
        assert await a.get(token) is not None  # b's use counted
        clock.advance(61)
        assert await b.get(token) is None
        assert await client.exists(key_of(token)) == 0


async def test_a_session_ends_after_its_lifetime_on_every_replica_even_when_used(redis_server: RedisServer) -> None:
    clock = Clock()
    limits = {"lifetime": 100.0, "idle": 60.0, "clock": clock}
    async with (
        replica(redis_server.url, "a", **limits) as a,
        replica(redis_server.url, "b", **limits) as b,
        raw(redis_server.url) as client,
    ):
        token = await a.create("key1", "")
        for store in (b, a, b):
            clock.advance(30)
            assert await store.get(token) is not None
        assert await client.pttl(key_of(token)) <= 10_000  # the TTL is the lifetime left, not the idle timeout
        clock.advance(10)
        assert await a.get(token) is None
        assert await b.get(token) is None


async def test_redis_itself_expires_a_session_left_idle(redis_server: RedisServer) -> None:
    async with (
        replica(redis_server.url, "a", idle=0.2) as a,
        replica(redis_server.url, "b", idle=0.2) as b,
        raw(redis_server.url) as client,
    ):
        token = await a.create("key1", "")
        await asyncio.sleep(0.4)
        assert await client.exists(key_of(token)) == 0
        assert await b.get(token) is None


async def test_the_oldest_sign_in_gives_way_past_the_cap_across_replicas(redis_server: RedisServer) -> None:
    clock = Clock()
    limits = {"max_sessions": 2, "clock": clock}
    async with replica(redis_server.url, "a", **limits) as a, replica(redis_server.url, "b", **limits) as b:
        tokens = []
        for store in (a, b, a):
            tokens.append(await store.create("key1", ""))
            clock.advance(1)
        oldest, middle, newest = tokens
        assert await b.get(oldest) is None
        assert await b.get(middle) is not None
        assert await b.get(newest) is not None


async def test_with_redis_down_sign_ins_are_kept_in_memory_without_raising(redis_server: RedisServer) -> None:
    async with replica(redis_server.url, "a") as a, replica(redis_server.url, "b") as b:
        shared = await a.create("key1", "")
        redis_server.stop()
        started = time.monotonic()
        assert await a.get(shared) is None  # kept in Redis: unusable until it is back
        local = await a.create("key1", "")
        assert await a.get(local) is not None  # works on this replica
        assert await b.get(local) is None  # and on this one only
        await b.drop(shared)
        await a.drop_owner("key2")
        assert time.monotonic() - started < 5  # every call bounded
        redis_server.start()  # back, empty
        await wait_for_async(lambda: _visible(a, b), what="sign-ins shared again once Redis is back")
        assert await a.get(local) is not None  # sessions made while it was down still work here
        await a.drop_owner("key1")
        assert await a.get(local) is None


async def test_a_sign_out_redis_missed_is_done_there_once_it_answers_again(redis_server: RedisServer) -> None:
    async with replica(redis_server.url, "a") as a, replica(redis_server.url, "b") as b:
        token, other = await a.create("key1", ""), await a.create("key1", "")
        redis_server.freeze()
        try:
            assert await a.get(other) is None  # times out: replica a holds Redis for down and stops asking
            await a.drop(token)  # not sent: remembered
            assert await a.get(token) is None
        finally:
            redis_server.thaw()
        await wait_for_async(lambda: _is_live(a, other), what="replica a reaching Redis again")
        assert await b.get(token) is None


async def test_a_browser_signed_in_on_one_replica_is_signed_in_on_the_other(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    origin = "http://ui.test"
    store = await SqliteStore.open(tmp_path / "state.sqlite")  # the replicas' shared records (Kubernetes, there)
    keys = ApiKeys(store)
    _, raw_key = await keys.create("laptop")
    services = UiServices(activator=activator(store, FakeRuntime(), Clock(), domain="ui.test"), keys=keys)
    async with (
        replica(redis_server.url, "a") as a,
        replica(redis_server.url, "b") as b,
        client_of(Litestar([ui_router(services, sessions=a)]), origin) as on_a,
        client_of(Litestar([ui_router(services, sessions=b)]), origin) as on_b,
    ):
        signed_in = await on_a.post("/ui/login", data={"key": raw_key, "next": ""}, headers={"Origin": origin})
        assert signed_in.status_code == 200  # the redirect to the sandboxes page, followed on replica a
        on_b.cookies = on_a.cookies  # the browser's next request lands on replica b
        page = await on_b.get("/ui/sandboxes", follow_redirects=False)
        assert page.status_code == 200
        csrf = page.text.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
        signed_out = await on_b.post("/ui/logout", data={"csrf": csrf}, headers={"Origin": origin})
        assert signed_out.status_code == 200  # the sign-in form, on replica b
        assert (await on_a.get("/ui/sandboxes", follow_redirects=False)).status_code == 303  # a's copy is dead too
    await store.close()


async def _visible(a: SharedSessionStore, b: SharedSessionStore) -> bool:
    return await b.get(await a.create("key3", "")) is not None


async def _is_live(store: SharedSessionStore, token: str) -> bool:
    return await store.get(token) is not None
