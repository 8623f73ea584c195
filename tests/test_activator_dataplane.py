"""The gateway's side of the activator: opening upstream sockets and waking paused or snapshotted sandboxes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from activator import (
    CLIENT_GONE,
    Activator,
    ClientGone,
    HoldQueueFull,
    HoldTimeout,
    Lifecycle,
    PortNotOpen,
    SandboxNotFound,
    SandboxState,
    Store,
)
from tests import test_activator_fakes as fakes
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request, template

pytestmark = pytest.mark.anyio

WAKES = Lifecycle(on_timeout="pause", auto_resume=True)


store, runtime, clock = fakes.store, fakes.runtime, fakes.clock  # the shared fixtures, bound by name for pytest


def held(runtime: FakeRuntime, method: str) -> asyncio.Event:
    """Make the runtime's `method` wait until the returned event is set."""
    release, original = asyncio.Event(), getattr(runtime, method)

    async def slow(*args: object, **options: object) -> object:
        await release.wait()
        return await original(*args, **options)

    setattr(runtime, method, slow)
    return release


async def opened(act: Activator, sandbox_id: str, count: int) -> None:
    for sock in await asyncio.gather(*(act.open_upstream(sandbox_id, 8080) for _ in range(count))):
        sock.close()


async def test_a_running_sandbox_gets_a_socket(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request())
    (await act.open_upstream(record.id, 8080)).close()
    assert act.telemetry.holds == {}


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
    assert act.get("alice", record.id).state == SandboxState.SNAPSHOTTED
    assert act.telemetry.holds == {}  # refused at once, never held


async def test_concurrent_requests_share_one_restore(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request(lifecycle=WAKES))
    await act.pause("alice", record.id)
    release = held(runtime, "restore")
    opening = asyncio.gather(*(act.open_upstream(record.id, 8080) for _ in range(50)))
    await asyncio.sleep(0.01)
    assert act.holds.held == 50
    release.set()
    for sock in await opening:
        sock.close()
    assert [call for call in runtime.calls if call[0] == "restore"] == [("restore", record.id)]
    assert act.get("alice", record.id).state == SandboxState.RUNNING
    assert (act.telemetry.holds["resumed"], act.telemetry.activations["ok"]) == (50, 1)
    assert act.telemetry.latency[("activation", "criu")].count == 1


async def test_a_frozen_sandbox_is_thawed_before_anything_connects(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock, template("base", pause_after=10))
    record = await act.create("alice", request())
    clock.advance(11)
    await act.reap_once()
    assert act.get("alice", record.id).state == SandboxState.PAUSED
    runtime.calls.clear()
    await opened(act, record.id, 3)  # the fake refuses connections into a frozen sandbox
    assert [name for name, _ in runtime.calls] == ["thaw", "open_socket", "open_socket", "open_socket"]
    assert act.get("alice", record.id).end_at == record.end_at  # traffic does not lengthen the TTL


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
    release = held(runtime, "restore")
    waiting = asyncio.gather(*(act.open_upstream(record.id, 8080) for _ in range(2)))
    await asyncio.sleep(0.01)
    with pytest.raises(HoldQueueFull):
        await act.open_upstream(record.id, 8080)
    release.set()
    for sock in await waiting:
        sock.close()
    assert act.telemetry.holds == {"queue_full": 1, "resumed": 2}


async def test_a_hold_past_its_deadline_fails_but_the_resume_goes_on(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock, hold_deadline=0.01)
    record = await act.create("alice", request(lifecycle=WAKES))
    await act.pause("alice", record.id)
    release = held(runtime, "restore")
    with pytest.raises(HoldTimeout):
        await act.open_upstream(record.id, 8080)
    release.set()
    _, resumed_by_connect = await act.connect("alice", record.id, 1)  # queues behind the wake on the lock
    assert not resumed_by_connect
    assert act.get("alice", record.id).state == SandboxState.RUNNING
    assert act.telemetry.holds == {"timeout": 1}


async def test_a_client_that_leaves_is_released_and_counted_while_the_others_wait(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request(lifecycle=WAKES))
    await act.pause("alice", record.id)
    release, leave = held(runtime, "restore"), asyncio.Event()

    async def open_as(client: Callable[[], Awaitable[object]] | None) -> object:
        CLIENT_GONE.set(client)  # each task has its own context, as each request has
        return await act.open_upstream(record.id, 8080)

    leaving = asyncio.create_task(open_as(leave.wait))
    staying = asyncio.create_task(open_as(None))
    await asyncio.sleep(0.01)
    leave.set()
    with pytest.raises(ClientGone):
        await leaving
    assert act.holds.held == 1
    release.set()
    (await staying).close()  # type: ignore[attr-defined]
    assert act.telemetry.holds == {"client_gone": 1, "resumed": 1}
    assert [name for name, _ in runtime.calls].count("open_socket") == 1  # the one that left never connected


async def test_a_request_during_an_idle_freeze_waits_for_it_and_wakes_the_sandbox(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock, template("base", pause_after=10))
    record = await act.create("alice", request())
    clock.advance(11)
    release = held(runtime, "freeze")
    reaping = asyncio.create_task(act.reap_once())
    await asyncio.sleep(0.01)  # the freeze is under way
    opening = asyncio.create_task(act.open_upstream(record.id, 8080))
    await asyncio.sleep(0.01)
    assert not opening.done()
    release.set()
    await reaping
    (await opening).close()
    assert [name for name, _ in runtime.calls if name != "open_socket"] == ["start", "freeze", "thaw"]
    assert act.get("alice", record.id).state == SandboxState.RUNNING


async def test_a_request_after_a_kill_began_is_not_found(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request())
    release = held(runtime, "stop")
    killing = asyncio.create_task(act.kill("alice", record.id))
    await asyncio.sleep(0.01)
    opening = asyncio.create_task(act.open_upstream(record.id, 8080))
    await asyncio.sleep(0.01)
    release.set()
    await killing
    with pytest.raises(SandboxNotFound):
        await opening


async def test_on_halt_hears_of_pauses_and_kills_before_they_happen(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    halted: list[tuple[str, bool]] = []
    act = activator(store, runtime, clock, on_halt=lambda i: halted.append((i, i in runtime.running)))
    record = await act.create("alice", request())
    await act.set_timeout("alice", record.id, 10)
    await act.pause("alice", record.id)
    await act.connect("alice", record.id, 10)
    await act.kill("alice", record.id)
    assert halted == [(record.id, True), (record.id, True)]
