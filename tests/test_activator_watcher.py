"""The activator tells its watcher (the coding-agent sessions' mirror) of each connection opened into a sandbox,
awaits it before a pause, snapshot or kill acts, while the sandbox's processes still run, and tells it again once
the runtime acted; a watcher that fails or hangs delays a transition by its deadline at most and never stops it."""

from __future__ import annotations

import asyncio

import pytest

from activator import PortNotOpen, SandboxRecord, SandboxState, Store, _machine
from tests import test_activator_fakes as fakes
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request

pytestmark = pytest.mark.anyio

store, runtime, clock = fakes.store, fakes.runtime, fakes.clock


class RecordingWatcher:
    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime
        self.heard: list[tuple[object, ...]] = []

    def opened(self, sandbox_id: str, port: int) -> None:
        self.heard.append(("opened", sandbox_id, port))

    async def halting(self, before: SandboxRecord | None, after: SandboxRecord) -> None:
        still_running = after.id in self.runtime.running and after.id not in self.runtime.frozen
        self.heard.append(("halting", before and before.state, after.state, still_running))

    def halted(self, record: SandboxRecord) -> None:
        self.heard.append(("halted", record.state, record.id in self.runtime.running))


async def test_the_watcher_hears_of_opened_ports_and_of_halts_before_the_runtime_acts(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    watcher = RecordingWatcher(runtime)
    sandboxes = activator(store, runtime, clock, watcher=watcher)
    record = await sandboxes.create("alice", request())
    (await sandboxes.open_upstream(record.id, 8080)).close()
    await sandboxes.pause("alice", record.id)
    await sandboxes.kill("alice", record.id)
    other = await sandboxes.create("alice", request())
    await sandboxes.kill("alice", other.id)
    running, paused, killed = SandboxState.RUNNING, SandboxState.SNAPSHOTTED, SandboxState.KILLED  # E2B pause
    assert watcher.heard == [
        ("opened", record.id, 8080),
        ("halting", running, paused, True),  # its processes still run: the mirror can copy their sessions
        ("halted", paused, False),
        ("halting", paused, killed, False),
        ("halted", killed, False),
        ("halting", running, killed, True),
        ("halted", killed, False),  # after the runtime acted: the copy ends only with a kill that happened
    ]


class BrokenWatcher(RecordingWatcher):
    def __init__(self, runtime: FakeRuntime, *, hang: bool) -> None:
        super().__init__(runtime)
        self.hang = hang

    async def halting(self, before: SandboxRecord | None, after: SandboxRecord) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        raise OSError("no space left on device")


@pytest.mark.parametrize("hang", [False, True], ids=["raising", "hanging"])
async def test_a_failing_watcher_does_not_stop_a_kill(
    store: Store, runtime: FakeRuntime, clock: Clock, monkeypatch: pytest.MonkeyPatch, hang: bool
) -> None:
    monkeypatch.setattr(_machine, "WATCHER_DEADLINE", 0.05)
    watcher = BrokenWatcher(runtime, hang=hang)
    sandboxes = activator(store, runtime, clock, watcher=watcher)
    record = await sandboxes.create("alice", request())
    await sandboxes.kill("alice", record.id)
    assert record.id not in runtime.running
    assert watcher.heard == [("halted", SandboxState.KILLED, False)]


async def test_a_failed_open_is_not_heard(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    watcher = RecordingWatcher(runtime)
    sandboxes = activator(store, runtime, clock, watcher=watcher)
    record = await sandboxes.create("alice", request())
    with pytest.raises(PortNotOpen):
        await sandboxes.open_upstream(record.id, 8081)
    assert watcher.heard == []
