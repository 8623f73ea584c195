"""Failed API-key checks per client address, as token buckets: past `per_minute` failures an address is refused.

Every key check that comes with a client address (the E2B API's `X-API-Key`, MCP's `Authorization`, the UI's
sign-in form, a keyed `/metrics`) takes a token of its address's bucket first and gives it back when the key was
right: successful checks cost nothing and are never slowed, failed ones use the bucket up. An empty bucket refuses
every check from that address (429 + Retry-After), the right key included, because answering the right key
there would tell a guesser it was right; other addresses are unaffected. A bucket holds `per_minute` tokens and
refills at `per_minute` a minute.

Keys carry 128 random bits, so guessing one is infeasible anyway; the limit keeps a guesser's noise off the
server and out of its logs. Behind a reverse proxy every client has the proxy's address and shares one bucket.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from activator._errors import TooManySignIns

__all__ = ["SignInLimiter"]

_ADDRESSES_KEPT = 10_000  # buckets kept at most; past it, full ones go (they hold nothing a new one would not)


class SignInLimiter:
    """The buckets of failed key checks, by client address (event loop only: no awaits, so no lock)."""

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        """`per_minute` failures an address may make in a burst, and again every minute; 0 turns the limit off."""
        if per_minute < 0:
            raise ValueError(f"the sign-in limit must be 0 (off) or more failures a minute, not {per_minute}")
        self._capacity = float(per_minute)
        self._rate = per_minute / 60.0  # tokens a second
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, clock time they were counted)

    def attempt(self, address: str) -> None:
        """Take a token for a key check from `address`; TooManySignIns (nothing taken) when there is none."""
        if not self._capacity:
            return
        tokens, now = self._tokens(address), self._clock()
        if tokens < 1:
            retry_after = math.ceil((1 - tokens) / self._rate)
            raise TooManySignIns(
                f"too many failed API-key checks from {address}: retry in {retry_after} s", retry_after=retry_after
            )
        self._keep(address, tokens - 1, now)

    def succeeded(self, address: str) -> None:
        """The check `attempt` was taken for found a key: give its token back."""
        if self._capacity:
            self._keep(address, self._tokens(address) + 1, self._clock())

    def _tokens(self, address: str) -> float:
        tokens, at = self._buckets.get(address, (self._capacity, 0.0))
        return min(self._capacity, tokens + (self._clock() - at) * self._rate)

    def _keep(self, address: str, tokens: float, now: float) -> None:
        if tokens >= self._capacity:
            self._buckets.pop(address, None)  # a full bucket is the same as none
            return
        if address not in self._buckets and len(self._buckets) >= _ADDRESSES_KEPT:
            self._buckets = {a: (t, at) for a, (t, at) in self._buckets.items() if self._tokens(a) < self._capacity}
            if len(self._buckets) >= _ADDRESSES_KEPT:  # all still in use: the oldest-made go first
                del self._buckets[next(iter(self._buckets))]
        self._buckets[address] = (tokens, now)
