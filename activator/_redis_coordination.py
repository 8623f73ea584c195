"""Gateway replicas coordinating through Redis: sandbox locks, change notices, batched activity timestamps.

Keys and channels, under `prefix` (default `agent-sandbox`):

    <prefix>:lock:<sandbox id>       string, the holder's random token; PX lock_ttl, renewed every lock_ttl/3 while
                                     held, deleted on release only by its holder (compare-and-delete script)
    <prefix>:activity:<replica id>   hash, sandbox id -> epoch seconds of the latest traffic that replica saw; one
                                     writer each, so its values only grow; expires activity_retention after the
                                     replica's last flush (a replica that is gone leaves nothing behind)
    <prefix>:activity-replicas       set of the replica ids that may have an activity hash
    <prefix>:changed    (channel)    "<replica id> <sandbox id>": that replica changed the sandbox's record
    <prefix>:released   (channel)    "<sandbox id>": its lock was just released, so waiters retry at once

Other parts keep their own state in the same Redis through `redis_call`, under `<prefix>:ui-session...` for the
web UI's sessions (gateway/ui/_shared_sessions.py), with the same deadline and the same view of Redis being down.

`activity()` is the maximum across the replicas' hashes (and this replica's own, unflushed figures).

Redis down: every call has a deadline (`call_timeout`) and no retry of its own. The first failure marks Redis
unreachable (one warning): from then on no call is tried, locks are local to this process, change notices are
dropped and activity stays local, until the background task, reconnecting with backoff, gets through (one
info line). While Redis is down two replicas may each resume the same sandbox: at worst one extra activation,
never a lost sandbox, since records and sandboxes live in Kubernetes. When it is back, each replica writes all
its activity again (Redis may have restarted empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RedisCoordinator"]

T = TypeVar("T")
_log = logging.getLogger("activator.coordination")
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)

# KEYS[1] = lock; ARGV = token, released channel, sandbox id. Deletes only the holder's own lock.
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
  redis.call('publish', ARGV[2], ARGV[3])
  return 1
end
return 0
"""
# KEYS[1] = lock; ARGV = token, ttl in ms. 0 when the lock is no longer ours.
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""


class _Unavailable(Exception):
    """Redis was not asked (it is down) or did not answer; the caller goes on alone."""


class RedisCoordinator:
    """Implements `Coordinator` on one Redis server shared by every gateway replica."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        replica_id: str,
        lock_ttl: float = 30.0,
        flush_interval: float = 1.0,
        call_timeout: float = 0.5,
        lock_retry: float = 0.05,
        lock_retry_max: float = 0.2,
        reconnect_max: float = 5.0,
        activity_retention: float = 86_400.0,
        prefix: str = "agent-sandbox",
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`lock_retry`..`lock_retry_max`: a waiter's poll backoff, in case a release message is lost;
        `activity_retention`: how long a sandbox's last activity is kept (longer than any idle threshold)."""
        if not replica_id or any(c.isspace() for c in replica_id):
            raise ValueError(f"a replica id must be a non-empty word without spaces, not {replica_id!r}")
        durations = (lock_ttl, flush_interval, call_timeout, lock_retry, lock_retry_max, reconnect_max)
        if min(*durations, activity_retention) <= 0:
            raise ValueError("the lock TTL, intervals, timeouts and retention must be positive")
        self._where = _redacted(url)
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=call_timeout,
            socket_connect_timeout=call_timeout,
            retry=Retry(NoBackoff(), 0),  # a failure marks Redis down; the reconnect loop does the retrying
        )
        self._replica_id = replica_id
        self._lock_ttl_ms = round(lock_ttl * 1000)
        self._renew_every = lock_ttl / 3
        self._flush_interval = flush_interval
        self._call_timeout = call_timeout
        self._lock_retry = (lock_retry, lock_retry_max)
        self._reconnect = (min(0.25, reconnect_max), reconnect_max)
        self._retention = activity_retention
        self._clock = clock
        self._prefix = prefix
        self._changed_channel = f"{prefix}:changed"
        self._released_channel = f"{prefix}:released"
        self._activity_key = f"{prefix}:activity:{replica_id}"
        self._replicas_key = f"{prefix}:activity-replicas"
        self._release_script = self._redis.register_script(_RELEASE)
        self._renew_script = self._redis.register_script(_RENEW)

        self._closed = False
        self._up: bool | None = None  # None until the first attempt to connect; written by _mark_up/_mark_down
        self._settled = asyncio.Event()  # set once the first attempt to connect has succeeded or failed
        self._on_changed: Callable[[str], None] = lambda _: None
        self._tasks: set[asyncio.Task[Any]] = set()  # background work, cancelled by `close`
        # In-process part of every sandbox lock: one acquirer per sandbox per process, so `_released` needs one
        # event per id, and the lock still excludes within this process while Redis is down.
        self._local: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._released: dict[str, asyncio.Event] = {}  # id -> its waiter's wake-up; set by the subscriber
        # Activity: id -> latest epoch seconds seen here (note_activity keeps the max; the flush drops entries older
        # than the retention); ids touched since the last flush; whether the next flush writes every id again.
        # All written on the event loop only (note_activity, the flusher), so no lock.
        self._seen: dict[str, float] = {}
        self._touched: set[str] = set()
        self._rewrite = True

    async def start(self, on_changed: Callable[[str], None]) -> None:
        """Subscribe and start the flusher; returns once the first connection attempt is over, either way."""
        if self._tasks:
            raise RuntimeError("this coordinator was already started")
        self._on_changed = on_changed
        self._spawn(self._supervise())
        self._spawn(self._flush_every())
        await self._settled.wait()

    async def close(self) -> None:
        """Stop the background work, flush the last activity (when Redis is up), disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._flush()
        self._up = False  # anything asked after this goes on alone, silently
        await self._redis.aclose()

    # -- locks --------------------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def sandbox_lock(self, sandbox_id: str) -> AsyncIterator[None]:
        async with self._local_lock(sandbox_id):
            token = await self._acquire(sandbox_id)
            renewer = self._spawn(self._keep(sandbox_id, token)) if token else None
            try:
                yield
            finally:
                if renewer is not None:
                    renewer.cancel()
                if token is not None:
                    await asyncio.shield(self._spawn(self._release(sandbox_id, token)))

    def _local_lock(self, sandbox_id: str) -> asyncio.Lock:
        lock = self._local.get(sandbox_id)
        if lock is None:
            lock = self._local[sandbox_id] = asyncio.Lock()
        return lock

    async def _acquire(self, sandbox_id: str) -> str | None:
        """The token of the lock, once this replica holds it; None when Redis is down (local lock only)."""
        token, key = secrets.token_hex(16), self._lock_key(sandbox_id)
        pause, longest = self._lock_retry
        released = self._released[sandbox_id] = asyncio.Event()
        try:
            while True:
                released.clear()
                try:
                    if await self._call(lambda: self._redis.set(key, token, nx=True, px=self._lock_ttl_ms)):
                        return token
                except _Unavailable:
                    return None
                except asyncio.CancelledError:  # the SET may have gone through: do not leave it to the TTL
                    self._spawn(self._release(sandbox_id, token))
                    raise
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await released.wait()
                pause = min(pause * 2, longest)
        finally:
            del self._released[sandbox_id]

    async def _keep(self, sandbox_id: str, token: str) -> None:
        """Renew the held lock until cancelled, so a long transition does not outlive it."""
        key = self._lock_key(sandbox_id)
        while True:
            await asyncio.sleep(self._renew_every)
            try:
                held = await self._call(lambda: self._renew_script(keys=[key], args=[token, self._lock_ttl_ms]))
            except _Unavailable:
                continue
            if not held:
                _log.warning("sandbox %s: its lock expired while held; another replica may act on it too", sandbox_id)
                return

    async def _release(self, sandbox_id: str, token: str) -> None:
        with contextlib.suppress(_Unavailable):  # down: the lock expires by itself
            key, channel = self._lock_key(sandbox_id), self._released_channel
            await self._call(lambda: self._release_script(keys=[key], args=[token, channel, sandbox_id]))

    def _lock_key(self, sandbox_id: str) -> str:
        return f"{self._prefix}:lock:{sandbox_id}"

    # -- change notices -----------------------------------------------------------------------------------

    async def publish_changed(self, sandbox_id: str) -> None:
        with contextlib.suppress(_Unavailable):  # down: the others re-read the record before their next transition
            message = f"{self._replica_id} {sandbox_id}"
            await self._call(lambda: self._redis.publish(self._changed_channel, message))

    def _dispatch(self, channel: str, data: str) -> None:
        if channel == self._released_channel:
            event = self._released.get(data)
            if event is not None:
                event.set()
        elif channel == self._changed_channel:
            replica, _, sandbox_id = data.partition(" ")
            if replica != self._replica_id and sandbox_id:
                try:
                    self._on_changed(sandbox_id)
                except Exception:  # a bad callback must not end the subscription
                    _log.exception("sandbox %s: handling its change notice failed", sandbox_id)

    # -- activity -----------------------------------------------------------------------------------------

    def note_activity(self, sandbox_id: str, at: float) -> None:
        if at > self._seen.get(sandbox_id, 0.0):
            self._seen[sandbox_id] = at
            self._touched.add(sandbox_id)

    async def activity(self) -> dict[str, float]:
        latest = dict(self._seen)
        try:
            members = await self._call(lambda: self._redis.smembers(self._replicas_key))
            replicas = sorted(str(member) for member in members)
            hashes = await self._call(lambda: self._read_hashes(replicas))
        except _Unavailable:
            return latest
        for fields in hashes:
            for sandbox_id, at in fields.items():
                latest[sandbox_id] = max(latest.get(sandbox_id, 0.0), float(at))
        gone = [replica for replica, fields in zip(replicas, hashes, strict=True) if not fields]
        if gone:  # their hashes expired
            with contextlib.suppress(_Unavailable):
                await self._call(lambda: self._redis.srem(self._replicas_key, *gone))
        return latest

    async def _read_hashes(self, replicas: Collection[str]) -> list[dict[str, str]]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for replica in replicas:
                pipe.hgetall(f"{self._prefix}:activity:{replica}")
            return list(await pipe.execute())

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval)
            await self._flush()

    async def _flush(self) -> None:
        """Write the ids touched since the last flush (all of them after a reconnect) in one round trip."""
        expired = self._expire(self._clock() - self._retention)
        if not self._up or not (self._touched or expired or (self._rewrite and self._seen)):
            return
        touched, rewrite = self._touched, self._rewrite
        self._touched, self._rewrite = set(), False
        latest = dict(self._seen) if rewrite else {i: self._seen[i] for i in touched}
        try:
            await self._call(lambda: self._write(latest, expired))
        except _Unavailable:  # written at a later flush (and after a reconnect, everything is)
            self._touched |= touched
            self._rewrite |= rewrite

    def _expire(self, before: float) -> list[str]:
        old = [sandbox_id for sandbox_id, at in self._seen.items() if at < before]
        for sandbox_id in old:
            del self._seen[sandbox_id]
            self._touched.discard(sandbox_id)
        return old

    async def _write(self, latest: dict[str, float], expired: list[str]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            if latest:
                pipe.hset(self._activity_key, mapping={i: repr(at) for i, at in latest.items()})
            if expired:
                pipe.hdel(self._activity_key, *expired)
            pipe.pexpire(self._activity_key, round(self._retention * 1000))
            pipe.sadd(self._replicas_key, self._replica_id)
            await pipe.execute()

    # -- other shared state (the web UI's sessions) -------------------------------------------------------

    @property
    def prefix(self) -> str:
        """The start of every key and channel here; others keeping state in this Redis put theirs under it."""
        return self._prefix

    async def redis_call(self, make: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """`make(client)`, bounded like the coordinator's own calls and not tried while Redis is held for down
        (a failure marks it down, the reconnect loop brings it back); ConnectionError when it was not answered."""
        try:
            return await self._call(lambda: make(self._redis))
        except _Unavailable as exc:
            raise ConnectionError(f"redis at {self._where} is unavailable") from exc

    # -- connection ---------------------------------------------------------------------------------------

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        """One bounded exchange with Redis; `_Unavailable` when it is down or fails to answer in time."""
        if not self._up:
            raise _Unavailable
        try:
            async with asyncio.timeout(self._call_timeout):
                return await make()
        except _UNREACHABLE as exc:
            self._mark_down(exc)
            raise _Unavailable from exc
        except RedisError as exc:  # answered, but refused (out of memory, a read-only replica...)
            _log.warning("redis at %s refused a call: %s", self._where, exc)
            raise _Unavailable from exc

    async def _supervise(self) -> None:
        """Stay subscribed while Redis is up; while it is down, try again with a growing pause."""
        first, longest = self._reconnect
        pause = first
        while True:
            got_through = await self._listen()
            self._settled.set()
            pause = first if got_through else pause
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)

    async def _listen(self) -> bool:
        """Subscribe, mark Redis up, and hand messages to `_dispatch` until Redis is marked down; whether it got
        through at all."""
        got_through = False
        try:
            async with self._redis.pubsub() as pubsub:
                async with asyncio.timeout(self._call_timeout):
                    await pubsub.subscribe(self._changed_channel, self._released_channel)
                    await self._redis.ping()
                self._mark_up()
                got_through = True
                self._settled.set()
                while self._up:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._call_timeout)
                    if message is not None and message["type"] == "message":
                        self._dispatch(str(message["channel"]), str(message["data"]))
        except (RedisError, OSError, TimeoutError) as exc:
            self._mark_down(exc)
        return got_through

    def _mark_up(self) -> None:
        if self._up is None:
            _log.info("coordinating with the other replicas through redis at %s as %s", self._where, self._replica_id)
        elif not self._up:
            _log.info("redis at %s is back: coordinating with the other replicas again", self._where)
        self._up = True
        self._rewrite = True  # Redis may have restarted empty: the next flush writes every id again

    def _mark_down(self, exc: BaseException) -> None:
        if self._up is not False:
            error = str(exc) or type(exc).__name__
            _log.warning("redis at %s unreachable: coordinating alone until it is back (%s)", self._where, error)
        self._up = False

    def _spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _redacted(url: str) -> str:
    """The URL without its password, for log lines."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
