"""`/metrics` renders what the activator counted, in a text format Prometheus' own parser reads."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from activator import Lifecycle, SqliteStore, Store
from gateway._metrics import MetricsSource, render_metrics
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request, template

pytestmark = pytest.mark.anyio


class _PoolFigures(msgspec.Struct):
    target: int
    ready: int
    claims: int


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await SqliteStore.open(tmp_path / "state.sqlite")
    yield store
    await store.close()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as (name, sorted labels) -> value, through prometheus_client's parser."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_metrics_count_transitions_holds_states_and_latencies(store: Store) -> None:
    runtime, clock = FakeRuntime(), Clock()
    runtime.listening.add(8080)
    act = activator(store, runtime, clock, template("base", pause_after=10))
    woken = await act.create("alice", request(lifecycle=Lifecycle(auto_resume=True)))
    paused = await act.create("alice", request())
    await act.pause("alice", woken.id)
    await act.pause("alice", paused.id)
    (await act.open_upstream(woken.id, 8080)).close()
    clock.advance(11)
    await act.reap_once()
    pools = {"base": _PoolFigures(target=2, ready=1, claims=5)}
    found = samples(render_metrics(MetricsSource(act, lambda: pools)))

    assert found[("agent_sandbox_held_requests", ())] == 0
    assert found[("agent_sandbox_hold_limit", ())] == 10_000
    assert found[("agent_sandbox_holds_total", (("result", "resumed"),))] == 1
    assert found[("agent_sandbox_holds_total", (("result", "queue_full"),))] == 0
    assert found[("agent_sandbox_activations_total", (("result", "ok"),))] == 1
    assert found[("agent_sandbox_transitions_total", (("from", "running"), ("to", "snapshotted")))] == 2
    assert found[("agent_sandbox_transitions_total", (("from", "running"), ("to", "paused")))] == 1
    assert found[("agent_sandbox_sandboxes", (("reason", "idle"), ("state", "paused")))] == 1
    assert found[("agent_sandbox_sandboxes", (("reason", "api"), ("state", "snapshotted")))] == 1
    assert found[("agent_sandbox_sandboxes", (("reason", ""), ("state", "running")))] == 0
    assert found[("agent_sandbox_snapshot_seconds_count", (("kind", "criu"),))] == 2
    assert found[("agent_sandbox_resume_seconds_bucket", (("kind", "criu"), ("le", "+Inf")))] == 1
    assert found[("agent_sandbox_cold_start_seconds_count", (("kind", "cold"),))] == 2
    assert found[("agent_sandbox_warm_pool_ready", (("template", "base"),))] == 1
    assert found[("agent_sandbox_warm_pool_claims_total", (("template", "base"),))] == 5


async def test_histogram_buckets_are_cumulative(store: Store) -> None:
    act = activator(store, FakeRuntime(), Clock())
    for seconds in (0.0002, 0.003, 0.003, 42.0):
        act.telemetry.observe("resume", "frozen", seconds)
    found = samples(render_metrics(MetricsSource(act)))
    bucket = "agent_sandbox_resume_seconds_bucket"
    counts = [found[(bucket, (("kind", "frozen"), ("le", le)))] for le in ("0.0005", "0.0025", "0.005", "+Inf")]
    assert counts == [1, 1, 3, 4]
    assert found[("agent_sandbox_resume_seconds_sum", (("kind", "frozen"),))] == pytest.approx(42.0062)
