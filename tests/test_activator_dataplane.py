"""The gateway's side of the activator: opening upstream sockets, waking paused sandboxes, the idle policy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from activator import (
    HoldQueueFull,
    HoldTimeout,
    Lifecycle,
    PortNotOpen,
    SandboxNotFound,
    SandboxState,
    Store,
)
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request, template

pytestmark = pytest.mark.anyio

WAKES = Lifecycle(on_timeout="pause", auto_resume=True)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(tmp_path / "state.sqlite")
    yield store
    await store.close()


@pytest.fixture
def runtime() -> FakeRuntime:
    runtime = FakeRuntime()
    runtime.listening.add(8080)
    return runtime


@pytest.fixture
def clock() -> Clock:
    return Clock()


def held_thaw(runtime: FakeRuntime) -> asyncio.Event:
    """Make `thaw` wait until the returned event is set."""
    release, thaw = asyncio.Event(), runtime.thaw

    async def slow_thaw(sandbox_id: str) -> None:
        await release.wait()
        await thaw(sandbox_id)

    runtime.thaw = slow_thaw  # type: ignore[method-assign]
    return release


async def test_a_running_sandbox_gets_a_socket(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request())
    (await act.open_upstream(record.id, 8080)).close()


async def test_unknown_killed_and_closed_ports_are_refused(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request())
    with pytest.raises(PortNotOpen):
        await act.open_upstream(record.id, 9999)
    with pytest.raises(SandboxNotFound):
        await act.open_upstream("nosuchsandbox", 8080)
    await act.kill("alice", record.id)
    with pytest.raises(SandboxNotFound):
        await act.open_upstream(record.id, 8080)


async def test_a_paused_sandbox_without_auto_resume_is_not_found(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request())
    await act.pause("alice", record.id)
    with pytest.raises(SandboxNotFound, match="was not found"):
        await act.open_upstream(record.id, 8080)
    assert act.get("alice", record.id).state == SandboxState.PAUSED


async def test_concurrent_requests_share_one_resume(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request(lifecycle=WAKES))
    await act.pause("alice", record.id)
    release = held_thaw(runtime)
    opening = [asyncio.create_task(act.open_upstream(record.id, 8080)) for _ in range(5)]
    await asyncio.sleep(0.01)
    release.set()
    for sock in await asyncio.gather(*opening):
        sock.close()
    assert [call for call in runtime.calls if call[0] == "thaw"] == [("thaw", record.id)]
    assert act.get("alice", record.id).state == SandboxState.RUNNING


async def test_a_timeout_paused_sandbox_wakes_with_its_full_timeout(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request(timeout=60, lifecycle=WAKES))
    clock.advance(61)
    await act.reap_once()
    (await act.open_upstream(record.id, 8080)).close()
    assert act.get("alice", record.id).end_at == clock.now + 60


async def test_holds_are_capped(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock, max_held=2)
    record = await act.create("alice", request(lifecycle=WAKES))
    await act.pause("alice", record.id)
    release = held_thaw(runtime)
    held = [asyncio.create_task(act.open_upstream(record.id, 8080)) for _ in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(HoldQueueFull):
        await act.open_upstream(record.id, 8080)
    release.set()
    for sock in await asyncio.gather(*held):
        sock.close()


async def test_a_hold_past_its_deadline_fails_but_the_resume_goes_on(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock, hold_deadline=0.01)
    record = await act.create("alice", request(lifecycle=WAKES))
    await act.pause("alice", record.id)
    release = held_thaw(runtime)
    with pytest.raises(HoldTimeout):
        await act.open_upstream(record.id, 8080)
    release.set()
    _, resumed_by_connect = await act.connect("alice", record.id, 1)  # queues behind the wake on the lock
    assert not resumed_by_connect
    assert act.get("alice", record.id).state == SandboxState.RUNNING


async def test_idle_sandboxes_pause_and_traffic_wakes_them(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock, template("base", pause_after=30))
    record = await act.create("alice", request())
    clock.advance(20)
    act.touch(record.id)
    clock.advance(20)
    await act.reap_once()
    assert act.get("alice", record.id).state == SandboxState.RUNNING  # touched 20 s ago
    clock.advance(11)
    await act.reap_once()
    assert act.get("alice", record.id).pause_reason == "idle"
    (await act.open_upstream(record.id, 8080)).close()
    assert act.get("alice", record.id).state == SandboxState.RUNNING


async def test_on_halt_hears_of_pauses_and_kills(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    halted: list[str] = []
    act = activator(store, runtime, clock, on_halt=halted.append)
    record = await act.create("alice", request())
    await act.set_timeout("alice", record.id, 10)
    await act.pause("alice", record.id)
    await act.connect("alice", record.id, 10)
    await act.kill("alice", record.id)
    assert halted == [record.id, record.id]
