"""The activator's counters and latency histograms, kept as plain numbers and read by the gateway's /metrics.

Recording costs a dictionary increment (counters) or a bisect and two additions (histograms); nothing is
rendered until a scrape asks. Everything here is written and read on the event loop thread only.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Literal

__all__ = ["LATENCY_BUCKETS", "Histogram", "HoldResult", "Telemetry"]

# Seconds: from a thaw (sub-millisecond) to a slow restore or cold start.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

HoldResult = Literal["resumed", "queue_full", "timeout", "client_gone", "failed"]


class Histogram:
    """A Prometheus-style histogram: per-bucket counts (not cumulative here), their sum and how many."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) for every bucket, ending with +Inf."""
        total, out = 0, []
        for bound, count in zip((*self.buckets, float("inf")), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out


class Telemetry:
    """What the lifecycle layer counts. Label values are small fixed sets, so the dictionaries stay small."""

    def __init__(self) -> None:
        self.holds: Counter[HoldResult] = Counter()  # data-plane requests that had to wait, by how it ended
        self.activations: Counter[str] = Counter()  # data-plane wake-ups (one per single flight): ok / error
        self.transitions: Counter[tuple[str, str]] = Counter()  # (from state, to state)
        # (operation, kind) -> seconds. Operations: cold_start (kind: cold), resume (frozen|criu|filesystem),
        # activation (the same kinds, as the first held request saw it), pause (frozen), snapshot (criu|filesystem).
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.snapshot_bytes: Counter[str] = Counter()  # kind -> bytes on disk written by snapshots, in total

    def observe(self, operation: str, kind: str, seconds: float) -> None:
        histogram = self.latency.get((operation, kind))
        if histogram is None:
            histogram = self.latency[(operation, kind)] = Histogram()
        histogram.observe(seconds)
