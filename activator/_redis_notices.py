"""Change notices between the gateway replicas: route-cache invalidation and the "sandbox ready" fan-out.

One channel, under the coordinator's prefix:

    <prefix>:changed (channel)   "<replica id> <sandbox id>": that replica changed the sandbox's record

A replica that changed a record names it; every other one runs its `on_changed` (the activator re-reads the
record). A notice sent while Redis is down is dropped: the others re-read a record before their next
transition of that sandbox anyway, so a lost notice costs a stale cache entry, never a wrong transition.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from activator._redis_link import RedisLink, RedisUnavailable

__all__ = ["ChangeNotices"]

_log = logging.getLogger("activator.coordination")


class ChangeNotices:
    """`Coordinator.publish_changed` and the listening side of it, on the shared Redis."""

    def __init__(self, link: RedisLink, *, prefix: str, replica_id: str) -> None:
        self._link = link
        self._replica_id = replica_id
        self.channel = f"{prefix}:changed"  # the supervisor hands its messages to `heard`
        self.on_changed: Callable[[str], None] = lambda _: None  # set by the coordinator's `start`

    async def publish(self, sandbox_id: str) -> None:
        """Tell the other replicas the sandbox's record changed (not sent while Redis is down)."""
        with contextlib.suppress(RedisUnavailable):
            message = f"{self._replica_id} {sandbox_id}"
            await self._link.call(lambda r: r.publish(self.channel, message))

    def heard(self, data: str) -> None:
        """A message on the channel: `on_changed` for another replica's change, nothing for our own."""
        replica, _, sandbox_id = data.partition(" ")
        if replica != self._replica_id and sandbox_id:
            try:
                self.on_changed(sandbox_id)
            except Exception:  # a bad callback must not end the subscription
                _log.exception("sandbox %s: handling its change notice failed", sandbox_id)
