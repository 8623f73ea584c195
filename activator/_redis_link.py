"""The gateway replicas' one connection to Redis, and whether it is up: what every shared concern calls through.

Every call has a deadline (`call_timeout`) and no retry of its own. The first failure marks Redis unreachable
(one warning): from then on no call is tried (`RedisUnavailable` at once) until the supervisor, reconnecting
with a growing pause, gets through again (one info line). The supervisor also holds the one subscription: it
hands each message of the channels it was started with to that channel's handler, on the event loop.

The background work of the concerns (the supervisor, lock renewals, the activity flusher) is spawned here, so
that `stop` ends all of it before the last writes and `close` disconnects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RedisLink", "RedisUnavailable"]

T = TypeVar("T")
_log = logging.getLogger("activator.coordination")
_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)


class RedisUnavailable(Exception):
    """Redis was not asked (it is down) or did not answer; the caller goes on alone."""


class RedisLink:
    """One Redis client with a deadline on every call, the up/down state, and the subscription's supervisor."""

    def __init__(self, url: str, *, replica_id: str, call_timeout: float, reconnect_max: float) -> None:
        self.where = _redacted(url)  # for log lines and errors: the URL without its password
        self._redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=call_timeout,
            socket_connect_timeout=call_timeout,
            retry=Retry(NoBackoff(), 0),  # a failure marks Redis down; the supervisor does the retrying
        )
        self._replica_id = replica_id
        self._call_timeout = call_timeout
        self._reconnect = (min(0.25, reconnect_max), reconnect_max)
        self._up: bool | None = None  # None until the first attempt to connect; written by _mark_up/_mark_down
        self._settled = asyncio.Event()  # set once the first attempt to connect has succeeded or failed
        self._tasks: set[asyncio.Task[Any]] = set()  # background work, cancelled by `stop`

    def script(self, source: str) -> AsyncScript:
        """A Lua script on this client, to run through `call`."""
        return self._redis.register_script(source)

    async def call(self, make: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
        """One bounded exchange, `make(client)`; `RedisUnavailable` when Redis is down or fails to answer in time."""
        if not self._up:
            raise RedisUnavailable
        try:
            async with asyncio.timeout(self._call_timeout):
                return await make(self._redis)
        except _UNREACHABLE as exc:
            self._mark_down(exc)
            raise RedisUnavailable from exc
        except RedisError as exc:  # answered, but refused (out of memory, a read-only replica...)
            _log.warning("redis at %s refused a call: %s", self.where, exc)
            raise RedisUnavailable from exc

    async def start(self, handlers: Mapping[str, Callable[[str], None]], on_up: Callable[[], None]) -> None:
        """Supervise the subscription to `handlers`' channels; `on_up` runs at each (re)connection. Returns once
        the first attempt to connect is over, either way."""
        if self._tasks:
            raise RuntimeError("this coordinator was already started")
        self.spawn(self._supervise(handlers, on_up))
        await self._settled.wait()

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `work` in the background until it ends or `stop` cancels it."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self) -> None:
        """Cancel the background work and wait for it to end; calls can still be made."""
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Disconnect; anything asked after this goes on alone, silently."""
        self._up = False
        await self._redis.aclose()

    async def _supervise(self, handlers: Mapping[str, Callable[[str], None]], on_up: Callable[[], None]) -> None:
        """Stay subscribed while Redis is up; while it is down, try again with a growing pause."""
        first, longest = self._reconnect
        pause = first
        while True:
            got_through = await self._listen(handlers, on_up)
            self._settled.set()
            pause = first if got_through else pause
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)

    async def _listen(self, handlers: Mapping[str, Callable[[str], None]], on_up: Callable[[], None]) -> bool:
        """Subscribe, mark Redis up, and hand messages to their handlers until Redis is marked down; whether it
        got through at all."""
        got_through = False
        try:
            async with self._redis.pubsub() as pubsub:
                async with asyncio.timeout(self._call_timeout):
                    await pubsub.subscribe(*handlers)
                    await self._redis.ping()
                self._mark_up()
                on_up()
                got_through = True
                self._settled.set()
                while self._up:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=self._call_timeout)
                    if message is not None and message["type"] == "message":
                        handler = handlers.get(str(message["channel"]))
                        if handler is not None:
                            handler(str(message["data"]))
        except (RedisError, OSError, TimeoutError) as exc:
            self._mark_down(exc)
        return got_through

    def _mark_up(self) -> None:
        if self._up is None:
            _log.info("coordinating with the other replicas through redis at %s as %s", self.where, self._replica_id)
        elif not self._up:
            _log.info("redis at %s is back: coordinating with the other replicas again", self.where)
        self._up = True

    def _mark_down(self, exc: BaseException) -> None:
        if self._up is not False:
            error = str(exc) or type(exc).__name__
            _log.warning("redis at %s unreachable: coordinating alone until it is back (%s)", self.where, error)
        self._up = False


def _redacted(url: str) -> str:
    """The URL without its password, for log lines."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()
