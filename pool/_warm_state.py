"""The bookkeeping of the warm pools (`_warm`): per-template state and figures, and the targets' validation."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import msgspec

from pool._templates import Template

__all__ = ["MAX_WARM", "PoolCounters", "TemplatePool", "WarmPoolStats", "resolve_targets"]

MAX_WARM = 1000  # the same bound a template file's `warm` has
_RATE_WINDOW = 60.0  # seconds of finished refills that `refill_rate` averages over


class WarmPoolStats(msgspec.Struct, frozen=True, kw_only=True):
    """One template's pool, for /metrics (the counters only ever grow) and the UI."""

    target: int  # how many ready sandboxes the refill aims for
    ready: int  # started, answering, unclaimed
    starting: int  # refills in flight
    claims: int  # claims answered with a warm sandbox
    misses: int  # claims answered with None (the caller cold-started)
    discarded: int  # warm sandboxes found dead at claim time, or gone on their own, and stopped
    refilled: int  # warm sandboxes started
    failures: int  # refill starts that failed
    refill_rate: float  # sandboxes started per second over the last minute


class PoolCounters:
    """One template's target, counters and refill backoff, as every kind of warm pool keeps them.

    Touched only on the event loop. `retry_at` is written by the refill (or warming) tasks and read by the
    loop that schedules them.
    """

    __slots__ = ("claims", "discarded", "failures", "failures_in_row", "finished", "misses", "refilled", "retry_at",
                 "target")  # fmt: skip

    def __init__(self, target: int) -> None:
        self.target = target
        self.claims = self.misses = self.discarded = self.refilled = self.failures = self.failures_in_row = 0
        self.retry_at = 0.0  # monotonic time before which no refill starts (backoff after failures)
        self.finished: deque[float] = deque()  # monotonic end times of refills within `_RATE_WINDOW`

    def refilled_at(self, now: float) -> None:
        """Count a refill that ended well at `now`: the failures in a row are over."""
        self.refilled += 1
        self.failures_in_row = 0
        self.finished.append(now)

    def failed(self, now: float, first: float, longest: float) -> float:
        """Count a failed refill and back off: `first` seconds, doubling per failure in a row, at most `longest`."""
        self.failures += 1
        self.failures_in_row += 1
        delay = min(longest, first * 2.0 ** (self.failures_in_row - 1))
        self.retry_at = now + delay
        return delay

    def figures(self, *, ready: int, starting: int, now: float) -> WarmPoolStats:
        """The counters with the pool's `ready` and `starting` sandboxes as counted by its owner."""
        while self.finished and self.finished[0] < now - _RATE_WINDOW:
            self.finished.popleft()
        return WarmPoolStats(
            target=self.target, ready=ready, starting=starting, claims=self.claims, misses=self.misses,
            discarded=self.discarded, refilled=self.refilled, failures=self.failures,
            refill_rate=len(self.finished) / _RATE_WINDOW,
        )  # fmt: skip


class TemplatePool(PoolCounters):
    """One template's ready sandboxes, refill state and counters.

    Touched only on the event loop. `ready` is appended by refill tasks and popped by claims; a claim pops
    before its first await, so two claims never take the same id and no lock is needed. `starting` and
    `retry_at` are written by the refill tasks and read by the refill loop's scheduling.
    """

    __slots__ = ("ready", "starting", "template")

    def __init__(self, template: Template, target: int) -> None:
        super().__init__(target)
        self.template = template
        self.ready: deque[str] = deque()  # oldest first
        self.starting = 0

    @property
    def filled(self) -> int:
        """Ready plus starting: what the pool will hold once its refills in flight end."""
        return len(self.ready) + self.starting

    def wants(self, now: float) -> bool:
        """Below target and not backing off."""
        return self.filled < self.target and self.retry_at <= now

    def started(self, sandbox_id: str, now: float) -> None:
        self.ready.append(sandbox_id)
        self.refilled_at(now)

    def stats(self, now: float) -> WarmPoolStats:
        return self.figures(ready=len(self.ready), starting=self.starting, now=now)


def resolve_targets(templates: Mapping[str, Template], overrides: Mapping[str, int]) -> dict[str, int]:
    """Each template's warm target: the server's override, else the template's own `warm`; ValueError if invalid."""
    unknown = sorted(set(overrides) - set(templates))
    if unknown:
        raise ValueError(
            f"warm pool for unknown template(s) {', '.join(map(repr, unknown))}; "
            f"known templates: {', '.join(sorted(templates)) or 'none'}"
        )
    bad = {name: count for name, count in overrides.items() if not 0 <= count <= MAX_WARM}
    if bad:
        listed = ", ".join(f"{name}={count}" for name, count in sorted(bad.items()))
        raise ValueError(f"warm pool sizes must be between 0 and {MAX_WARM}, not {listed}")
    return {name: overrides.get(name, template.warm) for name, template in templates.items()}
