"""`GET /metrics`: the Prometheus text format (version 0.0.4), rendered from plain numbers at scrape time.

Served on the control plane only (a sandbox hostname routes to the sandbox, so `/metrics` there is the
sandbox's own) and without an API key, like `/health`: the figures are counts and latencies, no sandbox ids,
no metadata. Put the server behind a firewall or proxy if even those should stay private.

Metrics (all prefixed `agent_sandbox_`):
    held_requests                        gauge      requests waiting for their sandbox to wake up
    hold_limit                           gauge      the cap on them (past it: 503 + Retry-After)
    holds_total{result}                  counter    held requests by outcome: resumed, queue_full, timeout,
                                                    client_gone, failed
    activations_total{result}            counter    data-plane wake-ups (one per single flight): ok, error
    transitions_total{from,to}           counter    state changes of sandboxes
    sandboxes{state,reason}              gauge      live sandboxes; reason: idle / api / timeout for pauses
    snapshot_bytes_total{kind}           counter    disk written by snapshots (criu, filesystem)
    {cold_start,resume,activation,pause,snapshot}_seconds{kind}   histograms: runtime action latency
    warm_pool_<field>{template}          gauge / counter, from the warm pools when there are any
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
from litestar import Response, get
from litestar.datastructures import State

from activator import Activator, Histogram, HoldResult, SandboxState

__all__ = ["METRICS_SOURCE", "MetricsSource", "metrics_route", "render_metrics"]

METRICS_SOURCE = "metrics_source"  # app.state key of the `MetricsSource`
_PREFIX = "agent_sandbox_"
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_HOLD_RESULTS: tuple[HoldResult, ...] = ("resumed", "queue_full", "timeout", "client_gone", "failed")
_ALWAYS_SHOWN = ((SandboxState.RUNNING, ""), (SandboxState.PAUSED, "idle"), (SandboxState.SNAPSHOTTED, "idle"),
                 (SandboxState.SNAPSHOTTED, "api"), (SandboxState.SNAPSHOTTED, "timeout"))  # fmt: skip
_HISTOGRAMS = {
    "cold_start": "Seconds to start a sandbox from nothing, by kind (cold).",
    "resume": "Seconds to bring a sandbox back to running, by what it resumed from (frozen, criu, filesystem).",
    "activation": "Seconds from the first held request to its sandbox running, by what it resumed from.",
    "pause": "Seconds to freeze a sandbox.",
    "snapshot": "Seconds to snapshot a sandbox to zero, by what the snapshot kept (criu, filesystem).",
}
_POOL_COUNTERS = frozenset({"claims", "misses", "discarded", "refilled", "failures"})

WarmPoolStats = Callable[[], Mapping[str, Any]]  # template -> a msgspec Struct of figures (pool.WarmPoolStats)


class MetricsSource(msgspec.Struct, frozen=True):
    """Where the figures come from: the activator, and the warm pools when there are any."""

    activator: Activator
    warm_pools: WarmPoolStats | None = None


def render_metrics(source: MetricsSource) -> str:
    """Every metric, in the text exposition format."""
    return "".join(_lines(source))


@get("/metrics", sync_to_thread=False)
def metrics_route(state: State) -> Response[str]:
    """Prometheus metrics; needs no API key."""
    source: MetricsSource = state[METRICS_SOURCE]
    return Response(render_metrics(source), media_type=_CONTENT_TYPE)


def _lines(source: MetricsSource) -> Iterator[str]:
    activator = source.activator
    telemetry = activator.telemetry
    yield from _family("held_requests", "gauge", "Requests waiting for their sandbox to wake up.",
                       [({}, activator.holds.held)])  # fmt: skip
    yield from _family("hold_limit", "gauge", "The cap on held requests.", [({}, activator.holds.max_held)])
    yield from _family("holds_total", "counter", "Held requests by how the hold ended.",
                       [({"result": r}, telemetry.holds[r]) for r in _HOLD_RESULTS])  # fmt: skip
    yield from _family("activations_total", "counter", "Data-plane wake-ups of sandboxes (one per single flight).",
                       [({"result": r}, telemetry.activations[r]) for r in ("ok", "error")])  # fmt: skip
    yield from _family("transitions_total", "counter", "Sandbox state changes.",
                       [({"from": a, "to": b}, n) for (a, b), n in sorted(telemetry.transitions.items())])  # fmt: skip
    census = activator.census()
    keys = sorted({*_ALWAYS_SHOWN, *census})
    yield from _family("sandboxes", "gauge", "Live sandboxes by state and pause reason.",
                       [({"state": s.value, "reason": r}, census[(s, r)]) for s, r in keys])  # fmt: skip
    yield from _family("snapshot_bytes_total", "counter", "Bytes on disk written by snapshots.",
                       [({"kind": k}, n) for k, n in sorted(telemetry.snapshot_bytes.items())])  # fmt: skip
    for operation, help_text in _HISTOGRAMS.items():
        found = sorted((kind, h) for (op, kind), h in telemetry.latency.items() if op == operation)
        yield from _histogram(f"{operation}_seconds", help_text, found)
    if source.warm_pools is not None:
        yield from _warm_pools(source.warm_pools())


def _family(name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> Iterator[str]:
    yield f"# HELP {_PREFIX}{name} {help_text}\n# TYPE {_PREFIX}{name} {kind}\n"
    for labels, value in samples:
        yield f"{_PREFIX}{name}{_labels(labels)} {_number(value)}\n"


def _histogram(name: str, help_text: str, by_kind: list[tuple[str, Histogram]]) -> Iterator[str]:
    yield f"# HELP {_PREFIX}{name} {help_text}\n# TYPE {_PREFIX}{name} histogram\n"
    for kind, histogram in by_kind:
        for bound, count in histogram.cumulative():
            yield f"{_PREFIX}{name}_bucket{_labels({'kind': kind, 'le': _number(bound)})} {count}\n"
        yield f"{_PREFIX}{name}_sum{_labels({'kind': kind})} {_number(histogram.sum)}\n"
        yield f"{_PREFIX}{name}_count{_labels({'kind': kind})} {histogram.count}\n"


def _warm_pools(pools: Mapping[str, Any]) -> Iterator[str]:
    fields: dict[str, list[tuple[dict[str, str], float]]] = {}
    for template, stats in sorted(pools.items()):
        for field, value in msgspec.structs.asdict(stats).items():
            fields.setdefault(field, []).append(({"template": template}, value))
    for field, samples in fields.items():
        kind = "counter" if field in _POOL_COUNTERS else "gauge"
        name = f"warm_pool_{field}_total" if kind == "counter" else f"warm_pool_{field}"
        yield from _family(name, kind, f"Warm pools: {field.replace('_', ' ')}.", samples)


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(value) if isinstance(value, float) else str(value)
