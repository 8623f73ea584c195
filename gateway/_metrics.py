"""`GET /metrics`: the Prometheus text format (version 0.0.4), rendered from plain numbers at scrape time.

Served on the control plane only (a sandbox hostname routes to the sandbox, so `/metrics` there is the
sandbox's own), or on a listener of its own (`serve --metrics-listen HOST:PORT`, `_metrics_listener`). It wants
an API key by default (`serve --metrics-auth key`: `X-API-Key`, or `Authorization: Bearer <key>` as Prometheus'
`authorization` scrape setting sends it), checked as every key check is, within the client's sign-in limit;
`--metrics-auth none` serves it to anyone who reaches it. The figures are counts and latencies: no sandbox ids,
no metadata, nothing of any one key.

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
from typing import Any, Protocol

import msgspec
from litestar import Request, Response, get
from litestar.datastructures import State
from litestar.exceptions import NotAuthorizedException

from activator import Activator, Histogram, HoldResult, SandboxState
from gateway._platform import Platform

__all__ = ["METRICS_SOURCE", "KeyCheck", "MetricsSource", "metrics_route", "metrics_source", "render_metrics"]

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


class KeyCheck(Protocol):
    """What a keyed /metrics needs of `ApiKeys`."""

    async def check(self, raw: str, client: str | None) -> str | None: ...


class MetricsSource(msgspec.Struct, frozen=True):
    """Where the figures come from: the activator, and the warm pools when there are any; and the keys a scrape
    must present one of (None: anyone may scrape)."""

    activator: Activator
    warm_pools: WarmPoolStats | None = None
    keys: KeyCheck | None = None


def metrics_source(platform: Platform) -> MetricsSource:
    """The platform's figures, behind its keys unless `--metrics-auth none`."""
    keys = platform.keys if platform.settings.metrics_auth == "key" else None
    return MetricsSource(platform.activator, platform.warm_pool_stats, keys=keys)


def render_metrics(source: MetricsSource) -> str:
    """Every metric, in the text exposition format."""
    return "".join(_lines(source))


@get("/metrics")
async def metrics_route(request: Request[Any, Any, Any], state: State) -> Response[str]:
    """Prometheus metrics: 401 without a key when they want one, 429 past the client's sign-in limit."""
    source: MetricsSource = state[METRICS_SOURCE]
    if source.keys is not None:
        await _require_key(request, source.keys)
    return Response(render_metrics(source), media_type=_CONTENT_TYPE)


async def _require_key(request: Request[Any, Any, Any], keys: KeyCheck) -> None:
    scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
    raw = request.headers.get("x-api-key") or (bearer.strip() if scheme.lower() == "bearer" else "")
    if not raw:
        raise NotAuthorizedException("/metrics wants an API key: send X-API-Key or Authorization: Bearer <key>")
    if await keys.check(raw, request.client.host if request.client else None) is None:
        raise NotAuthorizedException("invalid API key")


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
