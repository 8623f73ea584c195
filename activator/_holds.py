"""Bounds on data-plane requests held while their sandbox resumes: a cap on how many wait, a deadline on each,
and release of those whose client went away.

How a hold learns that its client left: the gateway sets `CLIENT_GONE` (a context variable, so it follows the
request's task down into `open_upstream`) to a coroutine function that returns once the client disconnected.
Without it a hold waits for the wake-up or its deadline only.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from activator._errors import ClientGone, HoldQueueFull, HoldTimeout
from activator._telemetry import Telemetry

__all__ = ["CLIENT_GONE", "HoldGate"]

T = TypeVar("T")

CLIENT_GONE: contextvars.ContextVar[Callable[[], Awaitable[object]] | None] = contextvars.ContextVar(
    "agent_sandbox_client_gone", default=None
)


class HoldGate:
    """Lets at most `max_held` requests wait at once, each for at most `deadline` seconds."""

    def __init__(self, *, max_held: int, deadline: float, telemetry: Telemetry | None = None) -> None:
        if max_held < 1 or deadline <= 0:
            raise ValueError(f"a hold gate needs max_held >= 1 and deadline > 0, not {max_held} and {deadline}")
        self.max_held = max_held
        self._deadline = deadline
        self._telemetry = telemetry or Telemetry()
        self._held = 0  # requests waiting now; changed only on the event loop, between awaits

    @property
    def held(self) -> int:
        """How many requests wait right now."""
        return self._held

    async def hold(self, wake: asyncio.Future[T]) -> T:
        """Wait for `wake` without cancelling it; `HoldQueueFull` at once past the cap, `HoldTimeout` past the
        deadline, `ClientGone` when the client disconnects first. Every outcome is counted."""
        counts = self._telemetry.holds
        if self._held >= self.max_held:
            counts["queue_full"] += 1
            raise HoldQueueFull(f"{self._held} requests already wait for sandboxes to resume; retry later")
        self._held += 1
        try:
            result = await self._wait(wake)
        except HoldTimeout:
            counts["timeout"] += 1
            raise
        except ClientGone:
            counts["client_gone"] += 1
            raise
        except BaseException:
            counts["failed"] += 1
            raise
        finally:
            self._held -= 1
        counts["resumed"] += 1
        return result

    async def _wait(self, wake: asyncio.Future[T]) -> T:
        gone = CLIENT_GONE.get()
        watcher = asyncio.ensure_future(gone()) if gone is not None else None
        waiting: set[asyncio.Future[Any]] = {wake} if watcher is None else {wake, watcher}
        try:
            async with asyncio.timeout(self._deadline):
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)  # never cancels `wake`
        except TimeoutError as exc:
            raise HoldTimeout(f"the sandbox did not resume within {self._deadline:g} s") from exc
        finally:
            if watcher is not None:
                watcher.cancel()  # no-op when it finished: then the client is gone, even if `wake` is done too
        if watcher is not None and watcher.done() and not watcher.cancelled():
            watcher.exception()  # retrieved: a failing watch means the connection is unusable as well
            raise ClientGone("the client went away while its request was held")
        return wake.result()
