"""The idle policy: freeze after `pause_after`, snapshot after `snapshot_after`, only when nothing is in flight."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from activator import Activator, SandboxState, Store
from tests import test_activator_fakes as fakes
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request, template

pytestmark = pytest.mark.anyio

RUNNING, PAUSED, SNAPSHOTTED = SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.SNAPSHOTTED


store, runtime, clock = fakes.store, fakes.runtime, fakes.clock  # the shared fixtures, bound by name for pytest


def idle_activator(store: Store, runtime: FakeRuntime, clock: Clock, **settings: Any) -> Activator:
    return activator(store, runtime, clock, template("base", pause_after=10, snapshot_after=30), **settings)


async def state_after(act: Activator, clock: Clock, seconds: float, sandbox_id: str) -> SandboxState:
    clock.advance(seconds)
    await act.reap_once()
    return act.get("alice", sandbox_id).state


async def test_an_idle_sandbox_freezes_then_snapshots(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = idle_activator(store, runtime, clock)
    record = await act.create("alice", request())
    assert await state_after(act, clock, 9, record.id) == RUNNING
    assert await state_after(act, clock, 2, record.id) == PAUSED
    assert await state_after(act, clock, 18, record.id) == PAUSED
    assert await state_after(act, clock, 2, record.id) == SNAPSHOTTED
    assert act.get("alice", record.id).reported_state == RUNNING  # transparent all along
    assert [name for name, _ in runtime.calls if name != "snapshot_keeps_processes"] == [
        "start", "freeze", "snapshot",
    ]  # fmt: skip


async def test_traffic_resets_the_idle_clock(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = idle_activator(store, runtime, clock)
    record = await act.create("alice", request())
    clock.advance(8)
    act.touch(record.id)
    assert await state_after(act, clock, 8, record.id) == RUNNING
    assert await state_after(act, clock, 3, record.id) == PAUSED


async def test_a_sandbox_whose_snapshot_would_lose_processes_stays_frozen(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    runtime.keeps_processes = False
    act = idle_activator(store, runtime, clock)
    record = await act.create("alice", request())
    assert await state_after(act, clock, 11, record.id) == PAUSED
    for _ in range(3):
        assert await state_after(act, clock, 30, record.id) == PAUSED
    # a frozen sandbox's processes cannot change: the runtime is asked once, not every pass
    assert runtime.calls.count(("snapshot_keeps_processes", record.id)) == 1


async def test_an_open_connection_keeps_a_sandbox_awake(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    halted: list[str] = []
    act = idle_activator(store, runtime, clock, on_halt=halted.append)
    record = await act.create("alice", request())
    sock = await act.open_upstream(record.id, 8080)  # e.g. a streaming response or a WebSocket
    assert await state_after(act, clock, 100, record.id) == RUNNING
    assert halted == [record.id]  # its idle keep-alive connections were dropped, in case that is all it was
    sock.close()
    assert await state_after(act, clock, 1, record.id) == SNAPSHOTTED  # idle for 101 s: straight to zero


async def test_traffic_between_the_scan_and_the_transition_cancels_it(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = idle_activator(store, runtime, clock)
    record = await act.create("alice", request())
    clock.advance(11)
    due = act._reaper._idle_step(act.get("alice", record.id), clock.now)
    assert due is not None
    sandbox_id, _, guard = due
    assert guard is not None
    assert guard()
    act.touch(sandbox_id)
    assert not guard()
    with socket.socket() as sock:
        act._activity.opened(sandbox_id, sock)
        clock.advance(1)
        assert act._reaper._idle_step(act.get("alice", record.id), clock.now) is None


async def test_the_server_overrides_the_template(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = idle_activator(store, runtime, clock, pause_after=0, snapshot_after=5)
    record = await act.create("alice", request())
    assert await state_after(act, clock, 4, record.id) == RUNNING
    assert await state_after(act, clock, 2, record.id) == SNAPSHOTTED


async def test_templates_without_thresholds_never_idle(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request(timeout=3600))
    assert await state_after(act, clock, 3000, record.id) == RUNNING


async def test_traffic_wakes_an_idle_snapshot_and_the_clock_starts_again(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = idle_activator(store, runtime, clock)
    record = await act.create("alice", request())
    assert await state_after(act, clock, 31, record.id) == SNAPSHOTTED
    act.touch(record.id)
    (await act.open_upstream(record.id, 8080)).close()
    woken = act.get("alice", record.id)
    assert (woken.state, woken.end_at, woken.started_at) == (RUNNING, record.end_at, record.started_at)
    assert await state_after(act, clock, 9, record.id) == RUNNING
    assert act.telemetry.latency[("resume", "criu")].count == 1


async def test_idle_time_counts_against_the_timeout(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = idle_activator(store, runtime, clock)
    record = await act.create("alice", request(timeout=60))
    assert await state_after(act, clock, 31, record.id) == SNAPSHOTTED
    clock.advance(30)
    await act.reap_once()
    assert act.live.get(record.id) is None
    assert record.id not in runtime.snapshots  # its files went with it
