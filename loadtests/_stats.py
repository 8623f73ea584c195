"""Percentiles and a fixed-width table, shared by the benchmark scripts."""

from __future__ import annotations

import statistics

__all__ = ["percentile", "row", "summary"]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


def summary(values_ms: list[float]) -> str:
    return (
        f"p50 {percentile(values_ms, 50):7.1f} ms  p99 {percentile(values_ms, 99):7.1f} ms  "
        f"min {min(values_ms):6.1f} ms  n={len(values_ms)}"
    )


def row(label: str, values_ms: list[float]) -> str:
    return f"{label:<44} {summary(values_ms)}"
