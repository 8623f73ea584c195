"""The metrics history (`activator._metrics_ring`): what a time range returns, how often a sandbox is sampled,
and what is kept, over the fake runtime and a hand-moved clock."""

from __future__ import annotations

import pytest

from activator import SAMPLE_INTERVAL, SAMPLES_KEPT, Activator, Store
from tests.test_activator_fakes import Clock, FakeRuntime, activator, clock, request, runtime, store

pytestmark = pytest.mark.anyio

clock, runtime, store = clock, runtime, store  # fixtures, bound for pytest


@pytest.fixture
def act(store: Store, runtime: FakeRuntime, clock: Clock) -> Activator:
    return activator(store, runtime, clock)


async def sample_passes(act: Activator, clock: Clock, count: int) -> None:
    """`count` passes of the sampler, `SAMPLE_INTERVAL` apart."""
    for _ in range(count):
        await act._samples.sample_all(act.live)
        clock.advance(SAMPLE_INTERVAL)


async def test_a_range_returns_every_sample_taken_within_it(act: Activator, clock: Clock) -> None:
    sandbox = await act.create("alice", request())
    first = int(clock.now)
    await sample_passes(act, clock, 4)
    samples = await act.metrics_between("alice", sandbox.id, first, int(clock.now) - 1)
    assert [s.at for s in samples] == [first + i * SAMPLE_INTERVAL for i in range(4)]
    later = await act.metrics_between("alice", sandbox.id, first + 6, None)
    assert [s.at for s in later] == [first + 10, first + 15, clock.now]  # the last one taken by the request


async def test_a_sample_taken_within_the_end_second_is_inside_it(act: Activator, clock: Clock) -> None:
    clock.advance(0.7)
    sandbox = await act.create("alice", request())
    [sample] = await act.metrics_between("alice", sandbox.id, None, int(clock.now))
    assert sample.at == clock.now


async def test_requests_sample_a_sandbox_at_most_once_per_interval(
    act: Activator, runtime: FakeRuntime, clock: Clock
) -> None:
    sandbox = await act.create("alice", request())
    for _ in range(5):
        await act.metrics_between("alice", sandbox.id, None, None)
        clock.advance(SAMPLE_INTERVAL / 5)
    assert runtime.calls.count(("stats", sandbox.id)) == 1


async def test_each_sandbox_keeps_only_its_last_samples(act: Activator, clock: Clock) -> None:
    sandbox = await act.create("alice", request(timeout=3600))
    await sample_passes(act, clock, SAMPLES_KEPT + 3)
    kept = act._samples.between(sandbox.id, None, None)
    assert len(kept) == SAMPLES_KEPT
    assert kept[-1].at == clock.now - SAMPLE_INTERVAL


async def test_paused_sandboxes_are_not_sampled_and_keep_their_history(
    act: Activator, runtime: FakeRuntime, clock: Clock
) -> None:
    sandbox = await act.create("alice", request())
    await sample_passes(act, clock, 2)
    await act.pause("alice", sandbox.id)
    await sample_passes(act, clock, 2)
    assert len(await act.metrics_between("alice", sandbox.id, None, None)) == 2
    assert runtime.calls.count(("stats", sandbox.id)) == 2


async def test_a_killed_sandbox_is_no_longer_sampled_nor_kept(
    act: Activator, runtime: FakeRuntime, clock: Clock
) -> None:
    sandbox = await act.create("alice", request())
    await sample_passes(act, clock, 1)
    await act.kill("alice", sandbox.id)
    await sample_passes(act, clock, 2)
    assert act._samples.newest(sandbox.id) is None
    assert runtime.calls.count(("stats", sandbox.id)) == 1
