"""After a restart `recover` finds every sandbox: re-adopted, kept frozen or resumable, or finished or undone."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from activator import SandboxNotFound, SandboxRecord, SandboxState, Store
from activator._transitions import IdleFreeze
from tests import test_activator_fakes as fakes
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request

pytestmark = pytest.mark.anyio


store, runtime, clock = fakes.store, fakes.runtime, fakes.clock  # the shared fixtures, bound by name for pytest


async def stored(store: Store, record: SandboxRecord, **changes: object) -> SandboxRecord:
    """Write a record as a crash would have left it."""
    record = replace(record, **changes)
    await store.put(record)
    return record


async def test_running_frozen_and_snapshotted_sandboxes_come_back_as_they_were(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    first = activator(store, runtime, clock)
    running, idle, paused = [await first.create("alice", request()) for _ in range(3)]
    await first._machine.apply(idle.id, IdleFreeze())
    await first.pause("alice", paused.id)
    runtime.calls.clear()
    second = activator(store, runtime, clock)
    await second.recover()
    assert second.get("alice", running.id).state == SandboxState.RUNNING
    assert second.get("alice", idle.id).state == SandboxState.PAUSED
    assert second.get("alice", paused.id).state == SandboxState.SNAPSHOTTED
    assert sorted(runtime.calls) == sorted([("thaw", running.id), ("freeze", idle.id)])
    resumed, was_paused = await second.connect("alice", paused.id, 60)
    assert (resumed.state, was_paused) == (SandboxState.RUNNING, True)


async def test_half_done_transitions_are_finished_or_undone(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    first = activator(store, runtime, clock)
    snapshotting, restoring, paused_gone = [await first.create("alice", request()) for _ in range(3)]
    # stored as snapshotted, processes still there: the dump never ran
    await stored(store, snapshotting, state=SandboxState.SNAPSHOTTED, pause_reason="api", remaining=10.0)
    # stored as running, but only the snapshot exists: the restore never ran
    await first.pause("alice", restoring.id)
    await stored(store, first.get("alice", restoring.id), state=SandboxState.RUNNING, pause_reason=None)
    # stored as paused, but the processes are gone and there is no snapshot
    await stored(store, paused_gone, state=SandboxState.PAUSED, pause_reason="idle")
    runtime.running.discard(paused_gone.id)
    runtime.calls.clear()
    second = activator(store, runtime, clock)
    await second.recover()
    assert second.get("alice", snapshotting.id).state == SandboxState.SNAPSHOTTED
    assert snapshotting.id in runtime.snapshots
    assert second.get("alice", restoring.id).state == SandboxState.RUNNING
    assert restoring.id in runtime.running
    with pytest.raises(SandboxNotFound):
        second.get("alice", paused_gone.id)
    assert sorted(runtime.calls) == sorted(
        [("snapshot", snapshotting.id), ("restore", restoring.id), ("stop", paused_gone.id)]
    )


async def test_a_sandbox_that_died_while_the_server_was_down_is_reported_crashed_and_resumable(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    first = activator(store, runtime, clock)
    dead = await first.create("alice", request())
    runtime.running.discard(dead.id)  # what the runtime's recover found: no processes, its files kept
    runtime.snapshots[dead.id] = "filesystem"
    runtime.crashed[dead.id] = "its pid 1 (the executor) ended while the server was not running"
    runtime.calls.clear()
    second = activator(store, runtime, clock)
    await second.recover()
    crashed = second.get("alice", dead.id)
    assert (crashed.state, crashed.pause_reason) == (SandboxState.SNAPSHOTTED, "crash")
    assert crashed.crash == "its pid 1 (the executor) ended while the server was not running"
    assert runtime.calls == []  # neither restored behind its owner's back nor stopped
    resumed, was_paused = await second.connect("alice", dead.id, 60)
    assert (resumed.state, resumed.crash, was_paused) == (SandboxState.RUNNING, None, True)


async def test_sandboxes_without_records_are_removed(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    runtime.running.add("orphanrunning")
    runtime.snapshots["orphansnapshot"] = "criu"
    await activator(store, runtime, clock).recover()
    assert sorted(runtime.calls) == [("stop", "orphanrunning"), ("stop", "orphansnapshot")]
    assert (runtime.running, runtime.snapshots) == (set(), {})


async def test_one_sandbox_that_cannot_be_recovered_does_not_stop_the_others(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    first = activator(store, runtime, clock)
    a, b = [await first.create("alice", request()) for _ in range(2)]
    runtime.fail.add("thaw")
    second = activator(store, runtime, clock)
    await second.recover()
    assert {r.id for r in second.live.values()} == {a.id, b.id}
