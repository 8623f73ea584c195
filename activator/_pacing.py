"""Each API key's authenticated requests are paced, so that one key's flood of cheap calls cannot take the
server's CPU from the other keys.

A key may make `per_second` requests a second, in bursts of twice that; a request past it waits its turn
(the virtual-scheduling form of a token bucket: each key has the time its next request may start), and only
one that would wait more than `max_wait` seconds is refused with 429 + Retry-After. Waiting, not refusing,
is what keeps a polling client cheap: 24 `curl` loops on one key's metrics slowed another key's create seven
times on 2 cores (their processes and the server's answers share the cores), and a refused loop would only
spin faster. Whoever presents the right key is paced; a wrong key is the sign-in limit's (`_signin`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from activator._errors import TooManyRequests

__all__ = ["RequestPacer"]


class RequestPacer:
    """The next start time of each key's requests (event loop only: no awaits before it is updated)."""

    def __init__(
        self,
        per_second: float,
        *,
        max_wait: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`per_second` requests a key may make a second, on average; 0 turns the pacing off."""
        if per_second < 0:
            raise ValueError(f"the request rate must be 0 (off) or more a second, not {per_second}")
        self._interval = 1 / per_second if per_second else 0.0
        self._burst = 2.0 if per_second else 0.0  # seconds of credit: two seconds' requests at once
        self._max_wait = max_wait
        self._clock = clock
        self._sleep = sleep
        self._next: dict[str, float] = {}  # key id -> when its next request may start without waiting

    async def admit(self, key_id: str) -> None:
        """Return when a request of `key_id` may go on; TooManyRequests when that is more than `max_wait` away."""
        if not self._interval:
            return
        now = self._clock()
        due = max(self._next.get(key_id, now), now - self._burst)
        wait = round(due + self._interval - self._burst - now, 9)  # to the nanosecond: sums of intervals drift
        if wait > self._max_wait:
            retry_after = math.ceil(wait)
            raise TooManyRequests(f"too many requests with this API key: retry in {retry_after} s", retry_after)
        self._next[key_id] = due + self._interval
        if wait > 0:
            await self._sleep(wait)
