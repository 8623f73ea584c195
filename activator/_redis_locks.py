"""Sandbox locks shared by the gateway replicas: one activation or transition of a sandbox at a time, anywhere.

Keys and channels, under the coordinator's prefix:

    <prefix>:lock:<sandbox id>   string, the holder's random token; PX lock_ttl, renewed every lock_ttl/3 while
                                 held, deleted on release only by its holder (compare-and-delete script)
    <prefix>:released (channel)  "<sandbox id>": its lock was just released, so waiters retry at once

A waiter polls too, with a growing pause, in case a release message is lost. Each lock has an in-process part
as well: one acquirer per sandbox per process, so the lock still excludes within this process while Redis is
down (the Redis part is then skipped; the lock of a holder that lost Redis expires by itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import AsyncIterator

from activator._redis_link import RedisLink, RedisUnavailable

__all__ = ["RedisLocks"]

_log = logging.getLogger("activator.coordination")

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


class RedisLocks:
    """`Coordinator.sandbox_lock` on the shared Redis, with a local lock under it."""

    def __init__(self, link: RedisLink, *, prefix: str, lock_ttl: float, retry: float, retry_max: float) -> None:
        self._link = link
        self._prefix = prefix
        self.released_channel = f"{prefix}:released"  # the supervisor hands its messages to `wake`
        self._ttl_ms = round(lock_ttl * 1000)
        self._renew_every = lock_ttl / 3
        self._retry = (retry, retry_max)
        self._release_script = link.script(_RELEASE)
        self._renew_script = link.script(_RENEW)
        # One asyncio.Lock per sandbox in use here, so `_released` needs one event per id.
        self._local: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._released: dict[str, asyncio.Event] = {}  # id -> its waiter's wake-up; set by `wake`

    @contextlib.asynccontextmanager
    async def hold(self, sandbox_id: str) -> AsyncIterator[None]:
        """Held around one activation or transition of the sandbox, exclusive across replicas."""
        async with self._local_lock(sandbox_id):
            token = await self._acquire(sandbox_id)
            renewer = self._link.spawn(self._keep(sandbox_id, token)) if token else None
            try:
                yield
            finally:
                if renewer is not None:
                    renewer.cancel()
                if token is not None:
                    await asyncio.shield(self._link.spawn(self._release(sandbox_id, token)))

    def wake(self, sandbox_id: str) -> None:
        """A `released` message: the waiter for that sandbox here, if any, tries again at once."""
        event = self._released.get(sandbox_id)
        if event is not None:
            event.set()

    def _local_lock(self, sandbox_id: str) -> asyncio.Lock:
        lock = self._local.get(sandbox_id)
        if lock is None:
            lock = self._local[sandbox_id] = asyncio.Lock()
        return lock

    async def _acquire(self, sandbox_id: str) -> str | None:
        """The token of the lock, once this replica holds it; None when Redis is down (local lock only)."""
        token, key = secrets.token_hex(16), self._key(sandbox_id)
        pause, longest = self._retry
        released = self._released[sandbox_id] = asyncio.Event()
        try:
            while True:
                released.clear()
                try:
                    if await self._link.call(lambda r: r.set(key, token, nx=True, px=self._ttl_ms)):
                        return token
                except RedisUnavailable:
                    return None
                except asyncio.CancelledError:  # the SET may have gone through: do not leave it to the TTL
                    self._link.spawn(self._release(sandbox_id, token))
                    raise
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await released.wait()
                pause = min(pause * 2, longest)
        finally:
            del self._released[sandbox_id]

    async def _keep(self, sandbox_id: str, token: str) -> None:
        """Renew the held lock until cancelled, so a long transition does not outlive it."""
        key = self._key(sandbox_id)
        while True:
            await asyncio.sleep(self._renew_every)
            try:
                held = await self._link.call(lambda _: self._renew_script(keys=[key], args=[token, self._ttl_ms]))
            except RedisUnavailable:
                continue
            if not held:
                _log.warning("sandbox %s: its lock expired while held; another replica may act on it too", sandbox_id)
                return

    async def _release(self, sandbox_id: str, token: str) -> None:
        with contextlib.suppress(RedisUnavailable):  # down: the lock expires by itself
            key, channel = self._key(sandbox_id), self.released_channel
            await self._link.call(lambda _: self._release_script(keys=[key], args=[token, channel, sandbox_id]))

    def _key(self, sandbox_id: str) -> str:
        return f"{self._prefix}:lock:{sandbox_id}"
