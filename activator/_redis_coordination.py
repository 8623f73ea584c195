"""Gateway replicas coordinating through one Redis: `Coordinator` composed of one module per concern.

    _redis_link.py        the connection: a deadline on every call, up/down, the subscription, reconnecting
    _redis_locks.py       sandbox locks             <prefix>:lock:<sandbox id>, channel <prefix>:released
    _redis_notices.py     change notices            channel <prefix>:changed
    _redis_activity.py    activity timestamps       <prefix>:activity:<replica id>, <prefix>:activity-replicas

`prefix` defaults to `agent-sandbox`. Other parts keep their own state in the same Redis through `redis_call`,
under `<prefix>:ui-session...` for the web UI's sessions (gateway/ui/_shared_sessions.py), with the same
deadline and the same view of Redis being down.

Redis down: every call has a deadline (`call_timeout`) and no retry of its own. The first failure marks Redis
unreachable (one warning): from then on no call is tried, locks are local to this process, change notices are
dropped and activity stays local, until the background task, reconnecting with backoff, gets through (one
info line). While Redis is down two replicas may each resume the same sandbox: at worst one extra activation,
never a lost sandbox, since records and sandboxes live in Kubernetes. When it is back, each replica writes all
its activity again (Redis may have restarted empty).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis

from activator._redis_activity import SharedActivity
from activator._redis_link import RedisLink, RedisUnavailable
from activator._redis_locks import RedisLocks
from activator._redis_notices import ChangeNotices

__all__ = ["RedisCoordinator"]

T = TypeVar("T")


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
        self._prefix = prefix
        self._link = RedisLink(url, replica_id=replica_id, call_timeout=call_timeout, reconnect_max=reconnect_max)
        self._locks = RedisLocks(
            self._link, prefix=prefix, lock_ttl=lock_ttl, retry=lock_retry, retry_max=lock_retry_max
        )
        self._notices = ChangeNotices(self._link, prefix=prefix, replica_id=replica_id)
        self._activity = SharedActivity(
            self._link, prefix=prefix, replica_id=replica_id, flush_interval=flush_interval,
            retention=activity_retention, clock=clock,
        )  # fmt: skip
        self._closed = False

    async def start(self, on_changed: Callable[[str], None]) -> None:
        """Subscribe and start the flusher; returns once the first connection attempt is over, either way."""
        self._notices.on_changed = on_changed
        handlers = {self._locks.released_channel: self._locks.wake, self._notices.channel: self._notices.heard}
        await self._link.start(handlers, on_up=self._activity.rewrite_all)
        self._link.spawn(self._activity.flush_every())

    async def close(self) -> None:
        """Stop the background work, flush the last activity (when Redis is up), disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._link.stop()
        await self._activity.flush()
        await self._link.close()

    def sandbox_lock(self, sandbox_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self._locks.hold(sandbox_id)

    async def publish_changed(self, sandbox_id: str) -> None:
        await self._notices.publish(sandbox_id)

    def note_activity(self, sandbox_id: str, at: float) -> None:
        self._activity.note(sandbox_id, at)

    async def activity(self) -> dict[str, float]:
        return await self._activity.latest()

    @property
    def prefix(self) -> str:
        """The start of every key and channel here; others keeping state in this Redis put theirs under it."""
        return self._prefix

    async def redis_call(self, make: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """`make(client)`, bounded like the coordinator's own calls and not tried while Redis is held for down
        (a failure marks it down, the reconnect loop brings it back); ConnectionError when it was not answered."""
        try:
            return await self._link.call(make)
        except RedisUnavailable as exc:
            raise ConnectionError(f"redis at {self._link.where} is unavailable") from exc
