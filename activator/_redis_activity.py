"""Activity timestamps shared by the gateway replicas, for the leader's idle policy: in memory, flushed in batches.

Keys, under the coordinator's prefix:

    <prefix>:activity:<replica id>   hash, sandbox id -> epoch seconds of the latest traffic that replica saw; one
                                     writer each, so its values only grow; expires `retention` after the
                                     replica's last flush (a replica that is gone leaves nothing behind)
    <prefix>:activity-replicas       set of the replica ids that may have an activity hash

`note` runs on every proxied request, so it only keeps the newest time in memory; every `flush_interval` the
ids touched since are written in one round trip. `latest` is the maximum across the replicas' hashes and this
replica's own, unflushed figures. While Redis is down activity stays local; at each (re)connection the next
flush writes every id again, since Redis may have restarted empty.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection

import redis.asyncio as aioredis

from activator._redis_link import RedisLink, RedisUnavailable

__all__ = ["SharedActivity"]


class SharedActivity:
    """`Coordinator.note_activity` and `Coordinator.activity` on the shared Redis."""

    def __init__(
        self,
        link: RedisLink,
        *,
        prefix: str,
        replica_id: str,
        flush_interval: float,
        retention: float,
        clock: Callable[[], float],
    ) -> None:
        self._link = link
        self._prefix = prefix
        self._replica_id = replica_id
        self._key = f"{prefix}:activity:{replica_id}"
        self._replicas_key = f"{prefix}:activity-replicas"
        self._flush_interval = flush_interval
        self._retention = retention
        self._clock = clock
        # id -> latest epoch seconds seen here (`note` keeps the max; a flush drops entries older than the
        # retention); ids touched since the last flush; whether the next flush writes every id again. All written
        # on the event loop only (`note`, the flusher, the supervisor's `rewrite_all`), so no lock.
        self._seen: dict[str, float] = {}
        self._touched: set[str] = set()
        self._rewrite = True

    def note(self, sandbox_id: str, at: float) -> None:
        if at > self._seen.get(sandbox_id, 0.0):
            self._seen[sandbox_id] = at
            self._touched.add(sandbox_id)

    def rewrite_all(self) -> None:
        """Redis is (back) up and may have restarted empty: the next flush writes every id again."""
        self._rewrite = True

    async def latest(self) -> dict[str, float]:
        """The latest activity per sandbox across the replicas; this replica's own only, while Redis is down."""
        latest = dict(self._seen)
        try:
            members = await self._link.call(lambda r: r.smembers(self._replicas_key))
            replicas = sorted(str(member) for member in members)
            hashes = await self._link.call(lambda r: self._read_hashes(r, replicas))
        except RedisUnavailable:
            return latest
        for fields in hashes:
            for sandbox_id, at in fields.items():
                latest[sandbox_id] = max(latest.get(sandbox_id, 0.0), float(at))
        gone = [replica for replica, fields in zip(replicas, hashes, strict=True) if not fields]
        if gone:  # their hashes expired
            with contextlib.suppress(RedisUnavailable):
                await self._link.call(lambda r: r.srem(self._replicas_key, *gone))
        return latest

    async def flush_every(self) -> None:
        """The flusher: runs until cancelled."""
        while True:
            await asyncio.sleep(self._flush_interval)
            await self.flush()

    async def flush(self) -> None:
        """Write the ids touched since the last flush (all of them after a reconnect) in one round trip."""
        expired = self._expire(self._clock() - self._retention)
        if not (self._touched or expired or (self._rewrite and self._seen)):
            return
        touched, rewrite = self._touched, self._rewrite
        self._touched, self._rewrite = set(), False
        latest = dict(self._seen) if rewrite else {i: self._seen[i] for i in touched}
        try:
            await self._link.call(lambda r: self._write(r, latest, expired))
        except RedisUnavailable:  # written at a later flush (and after a reconnect, everything is)
            self._touched |= touched
            self._rewrite |= rewrite

    async def _read_hashes(self, redis: aioredis.Redis, replicas: Collection[str]) -> list[dict[str, str]]:
        async with redis.pipeline(transaction=False) as pipe:
            for replica in replicas:
                pipe.hgetall(f"{self._prefix}:activity:{replica}")
            return list(await pipe.execute())

    def _expire(self, before: float) -> list[str]:
        old = [sandbox_id for sandbox_id, at in self._seen.items() if at < before]
        for sandbox_id in old:
            del self._seen[sandbox_id]
            self._touched.discard(sandbox_id)
        return old

    async def _write(self, redis: aioredis.Redis, latest: dict[str, float], expired: list[str]) -> None:
        async with redis.pipeline(transaction=False) as pipe:
            if latest:
                pipe.hset(self._key, mapping={i: repr(at) for i, at in latest.items()})
            if expired:
                pipe.hdel(self._key, *expired)
            pipe.pexpire(self._key, round(self._retention * 1000))
            pipe.sadd(self._replicas_key, self._replica_id)
            await pipe.execute()
