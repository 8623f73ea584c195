"""UI sessions in the Redis the gateway replicas share: a browser signed in on one replica is signed in on all.

Keys, under the coordinator's prefix (`agent-sandbox`):

    <prefix>:ui-session:<sha256(id)>   the session's msgspec JSON; PX = until its absolute or idle expiry,
                                       whichever comes first, moved on use (at most every min(idle/100, 10 s))
    <prefix>:ui-sessions-of:<owner>    set of the digests of a key's sessions, for `drop_owner`
    <prefix>:ui-sessions               sorted set, digest -> sign-in time: the cap (the oldest sign-in gives way)

No replica keeps a copy of a session it read from Redis, so a sign-out or a revocation on one replica ends the
id on every other at its next request. Every call goes through the coordinator (`redis_call`): its deadline,
and no call at all while it holds Redis for down. Redis unreachable: sessions made then are kept in this
replica's memory and work on this replica only; sessions kept in Redis do not work until it is back; a
sign-out is remembered and done in Redis as soon as it answers again. Nothing raises into a request.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import msgspec
import redis.asyncio as aioredis

from gateway.ui._sessions import Session, SessionStore, check_limits, expires_at, new_session, session_digest

__all__ = ["SharedRedis", "SharedSessionStore"]

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Session).decode


class SharedRedis(Protocol):
    """What the store needs of `activator.RedisCoordinator`: its key prefix and a bounded call on its client."""

    @property
    def prefix(self) -> str: ...

    async def redis_call(self, make: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """`make(client)` within the coordinator's deadline; ConnectionError when Redis is down or failed."""
        ...


class SharedSessionStore:
    """Implements `Sessions` in Redis, falling back to this replica's memory while Redis is unreachable.

    Shared by every request on the event loop. `_undelivered` (digests signed out while Redis was unreachable,
    oldest first) is written by `drop` and emptied once Redis has deleted them; no lock, since a digest added
    while a delivery is in flight stays until the next one."""

    def __init__(
        self,
        redis: SharedRedis,
        *,
        lifetime: float = 12 * 3600.0,
        idle: float = 2 * 3600.0,
        max_sessions: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_limits(lifetime, idle, max_sessions)
        self._redis = redis
        self._lifetime = lifetime
        self._idle = idle
        self._max = max_sessions
        self._clock = clock
        self._touch_every = min(idle / 100, 10.0)  # a stream's ticks do not each write the session back
        self._local = SessionStore(lifetime=lifetime, idle=idle, max_sessions=max_sessions, clock=clock)
        self._undelivered: dict[str, None] = {}
        prefix = redis.prefix
        self._session_prefix = f"{prefix}:ui-session:"
        self._owner_prefix = f"{prefix}:ui-sessions-of:"
        self._all_key = f"{prefix}:ui-sessions"

    @property
    def lifetime(self) -> float:
        return self._lifetime

    @property
    def local(self) -> SessionStore:
        """The sessions made while Redis was unreachable: they work on this replica only."""
        return self._local

    async def create(self, owner: str, key_name: str) -> str:
        now = self._clock()
        session_id, session = new_session(owner, key_name, now)
        digest = session_digest(session_id)
        try:
            await self._deliver_drops()
            count = await self._redis.redis_call(lambda r: self._insert(r, digest, session, now))
        except ConnectionError:
            return await self._local.create(owner, key_name)
        if count > self._max:
            with contextlib.suppress(ConnectionError):  # the next sign-in evicts them
                await self._redis.redis_call(lambda r: self._evict(r, count - self._max))
        return session_id

    async def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        if session_id in self._local:
            return await self._local.get(session_id)
        digest = session_digest(session_id)
        if digest in self._undelivered:
            return None
        try:
            await self._deliver_drops()
            record = await self._redis.redis_call(lambda r: r.get(self._key(digest)))
            return await self._live(digest, record)
        except ConnectionError:
            return None

    async def drop(self, session_id: str | None) -> None:
        if not session_id:
            return
        await self._local.drop(session_id)
        digest = session_digest(session_id)
        try:
            await self._redis.redis_call(lambda r: self._delete(r, [digest]))
        except ConnectionError:
            self._remember_drop(digest)

    async def drop_owner(self, owner: str) -> None:
        await self._local.drop_owner(owner)
        # Unreachable: its sessions in Redis end at their first use once it is back, when the key is checked again.
        with contextlib.suppress(ConnectionError):
            await self._redis.redis_call(lambda r: self._delete_owner(r, owner))

    async def _live(self, digest: str, record: bytes | str | None) -> Session | None:
        """The session a read found, still live and with its idle clock moved; None otherwise."""
        if record is None:
            return None
        try:
            session = _decode(record)
        except msgspec.DecodeError:  # not ours, or from an incompatible version: no session
            return None
        now = self._clock()
        if now >= expires_at(session, self._lifetime, self._idle):
            await self._redis.redis_call(lambda r: self._delete(r, [digest]))
            return None
        if now - session.last_seen >= self._touch_every:
            session.last_seen = now
            with contextlib.suppress(ConnectionError):  # it was live a moment ago; its idle clock moves next time
                await self._write(digest, session)
        return session

    async def _write(self, digest: str, session: Session) -> None:
        """Write a session back only while it exists (XX): one dropped meanwhile stays dropped."""
        ttl = self._ttl_ms(session)
        if ttl > 0:
            record = _encode(session)
            await self._redis.redis_call(lambda r: r.set(self._key(digest), record, xx=True, px=ttl))

    async def _insert(self, r: aioredis.Redis, digest: str, session: Session, now: float) -> int:
        """Store a new session; how many sessions the cap counts now."""
        owner_key, lifetime_ms = self._owner_key(session.owner), math.ceil(self._lifetime * 1000)
        async with r.pipeline(transaction=True) as pipe:
            pipe.set(self._key(digest), _encode(session), px=self._ttl_ms(session))
            pipe.sadd(owner_key, digest)
            pipe.pexpire(owner_key, lifetime_ms)
            pipe.zadd(self._all_key, {digest: now})
            pipe.zremrangebyscore(self._all_key, "-inf", now - self._lifetime)  # past their lifetime anyway
            pipe.pexpire(self._all_key, lifetime_ms)
            pipe.zcard(self._all_key)
            results = await pipe.execute()
        return int(results[-1])

    async def _evict(self, r: aioredis.Redis, excess: int) -> None:
        """The oldest sign-ins give way."""
        oldest = [str(digest) for digest in await r.zrange(self._all_key, 0, excess - 1)]
        if oldest:
            await self._delete(r, oldest)

    async def _delete(self, r: aioredis.Redis, digests: list[str]) -> None:
        async with r.pipeline(transaction=True) as pipe:
            pipe.delete(*(self._key(digest) for digest in digests))
            pipe.zrem(self._all_key, *digests)
            await pipe.execute()

    async def _delete_owner(self, r: aioredis.Redis, owner: str) -> None:
        owner_key = self._owner_key(owner)
        digests = [str(digest) for digest in await r.smembers(owner_key)]
        if digests:  # SREM, not DEL: a session made since the SMEMBERS keeps its entry
            async with r.pipeline(transaction=True) as pipe:
                pipe.delete(*(self._key(digest) for digest in digests))
                pipe.srem(owner_key, *digests)
                pipe.zrem(self._all_key, *digests)
                await pipe.execute()

    async def _deliver_drops(self) -> None:
        """Delete in Redis what was signed out while it was unreachable (ConnectionError while it still is)."""
        if self._undelivered:
            digests = list(self._undelivered)
            await self._redis.redis_call(lambda r: self._delete(r, digests))
            for digest in digests:
                self._undelivered.pop(digest, None)

    def _remember_drop(self, digest: str) -> None:
        self._undelivered[digest] = None
        while len(self._undelivered) > self._max:  # bounded: the oldest then ends only at its expiry
            del self._undelivered[next(iter(self._undelivered))]

    def _ttl_ms(self, session: Session) -> int:
        """Milliseconds until the session expires unless used again (0: it has)."""
        left = expires_at(session, self._lifetime, self._idle) - self._clock()
        return math.ceil(left * 1000) if left > 0 else 0

    def _key(self, digest: str) -> str:
        return self._session_prefix + digest

    def _owner_key(self, owner: str) -> str:
        return self._owner_prefix + owner
