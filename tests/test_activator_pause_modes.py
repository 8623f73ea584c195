"""E2B's pause variants through the activator, over the fake runtime: files-only pauses, reboot resumes, and
`requireHealthyGuest` (`pause(strict=True)`)."""

from __future__ import annotations

import msgspec
import pytest

from activator import Activator, GuestUnresponsive, SandboxState, Store
from activator._idle import IdlePolicy
from tests.test_activator_fakes import Clock, FakeRuntime, activator, clock, request, runtime, store, template

pytestmark = pytest.mark.anyio

clock, runtime, store = clock, runtime, store  # fixtures, bound for pytest


@pytest.fixture
def act(store: Store, runtime: FakeRuntime, clock: Clock) -> Activator:
    return activator(store, runtime, clock)


async def test_a_files_only_pause_asks_the_runtime_for_no_memory(act: Activator, runtime: FakeRuntime) -> None:
    sandbox = await act.create("alice", request())
    await act.pause("alice", sandbox.id, memory=False)
    assert runtime.snapshots[sandbox.id] == "filesystem"  # the fake keeps "criu" unless told otherwise
    await act.connect("alice", sandbox.id, 60)
    assert runtime.restored[sandbox.id] == "filesystem"


async def test_a_reboot_drops_the_memory_a_full_pause_kept(act: Activator, runtime: FakeRuntime) -> None:
    sandbox = await act.create("alice", request())
    await act.pause("alice", sandbox.id)
    assert runtime.snapshots[sandbox.id] == "criu"
    await act.connect("alice", sandbox.id, 60, memory=False)
    assert runtime.restored[sandbox.id] == "filesystem"


async def test_a_strict_pause_leaves_a_sandbox_whose_executor_is_unreachable_running(
    act: Activator, runtime: FakeRuntime
) -> None:
    sandbox = await act.create("alice", request())  # nothing listens on envd's port in the fake
    with pytest.raises(GuestUnresponsive) as raised:
        await act.pause("alice", sandbox.id, healthy_guest=True)
    assert raised.value.status_code == 503
    assert act.get("alice", sandbox.id).state is SandboxState.RUNNING
    assert ("snapshot", sandbox.id) not in runtime.calls


async def test_a_strict_pause_of_an_idle_snapshotted_sandbox_has_no_executor_to_ask(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    act = activator(store, runtime, clock, template(snapshot_after=1.0))
    sandbox = await act.create("alice", request())
    clock.advance(2)
    await act.reap_once()  # the idle policy scales it to zero
    assert act.get("alice", sandbox.id).state is SandboxState.SNAPSHOTTED
    await act.pause("alice", sandbox.id, healthy_guest=True)
    assert act.get("alice", sandbox.id).reported_state is SandboxState.PAUSED


async def test_a_pause_whose_memory_snapshot_fails_keeps_the_sandbox_frozen_not_a_fresh_start(
    act: Activator, runtime: FakeRuntime
) -> None:
    sandbox = await act.create("alice", request())
    runtime.dump_fails = True
    await act.pause("alice", sandbox.id)
    record = act.get("alice", sandbox.id)
    assert record.state is SandboxState.PAUSED  # frozen: its processes and memory are where they were
    assert record.user_paused
    assert sandbox.id in runtime.frozen
    assert sandbox.id not in runtime.snapshots
    assert any("kept frozen" in line.message for line in act.logs("alice", sandbox.id))
    await act.connect("alice", sandbox.id, 60)
    assert sandbox.id not in runtime.frozen  # thawed, not restored
    assert ("restore", sandbox.id) not in runtime.calls


async def test_a_freeze_only_template_is_frozen_by_a_pause_and_never_snapshotted_when_idle(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    frozen_only = msgspec.structs.replace(template("desktop", snapshot_after=1.0), freeze_only=True)
    act = activator(store, runtime, clock, frozen_only)
    sandbox = await act.create("alice", request(template="desktop"))
    await act.pause("alice", sandbox.id)
    assert act.get("alice", sandbox.id).state is SandboxState.PAUSED
    assert sandbox.id in runtime.frozen
    assert ("snapshot", sandbox.id) not in runtime.calls  # not even tried
    idle = IdlePolicy({"desktop": frozen_only}, pause_after=None, snapshot_after=0.5)
    assert idle.thresholds("desktop") == (None, None)


def test_the_servers_off_switch_holds_for_templates_built_after_the_start() -> None:
    idle = IdlePolicy({}, pause_after=0, snapshot_after=0)  # 0: never
    assert idle.thresholds("a-build/of-a-key") == (None, None)
    assert IdlePolicy({}, pause_after=30, snapshot_after=None).thresholds("a-build/of-a-key") == (30, None)
