"""Bounds on data-plane requests held while their sandbox resumes: a cap on how many wait, a deadline on each."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from activator._errors import HoldQueueFull, HoldTimeout

__all__ = ["HoldGate"]

T = TypeVar("T")


class HoldGate:
    """Lets at most `max_held` requests wait at once, each for at most `deadline` seconds."""

    def __init__(self, *, max_held: int, deadline: float) -> None:
        if max_held < 1 or deadline <= 0:
            raise ValueError(f"a hold gate needs max_held >= 1 and deadline > 0, not {max_held} and {deadline}")
        self._max_held = max_held
        self._deadline = deadline
        self._held = 0  # requests waiting now; changed only on the event loop, between awaits

    @property
    def held(self) -> int:
        """How many requests wait right now."""
        return self._held

    async def hold(self, wake: Awaitable[T]) -> T:
        """Wait for `wake`; `HoldQueueFull` at once past the cap, `HoldTimeout` past the deadline.

        Pass a shielded future when the work behind it must outlive one impatient waiter.
        """
        if self._held >= self._max_held:
            raise HoldQueueFull(f"{self._held} requests already wait for sandboxes to resume; retry later")
        self._held += 1
        try:
            async with asyncio.timeout(self._deadline):
                return await wake
        except TimeoutError as exc:
            raise HoldTimeout(f"the sandbox did not resume within {self._deadline:g} s") from exc
        finally:
            self._held -= 1
