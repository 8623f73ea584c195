"""The Activator's control-plane operations over a real store, a fake runtime and a hand-driven clock."""

from __future__ import annotations

import asyncio

import pytest

from activator import (
    ActivatorError,
    InvalidRequest,
    Lifecycle,
    SandboxConflict,
    SandboxNotFound,
    SandboxState,
    Store,
    TemplateNotFound,
)
from pool import SnapshotInfo
from tests import test_activator_fakes as fakes
from tests.polling import wait_for_async
from tests.test_activator_dataplane import held
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request, template

pytestmark = pytest.mark.anyio


store, runtime, clock = fakes.store, fakes.runtime, fakes.clock  # the shared fixtures, bound by name for pytest


class TestCreate:
    async def test_create_starts_the_runtime_with_the_executor_init(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        record = await activator(store, runtime, clock).create("alice", request(env_vars={"A": "1"}))
        spec = runtime.specs[record.id]
        assert (spec.template.name, spec.init.env_vars, spec.init.access_token) == (
            "base",
            {"A": "1"},
            record.access_token,
        )
        assert (spec.init.default_user, spec.init.default_workdir) == ("user", "/home/user")
        assert (record.state, record.end_at, record.cpu_count, record.memory_mb) == (
            "running",
            clock.now + 300,
            2,
            1024,
        )

    async def test_create_is_stored_before_it_answers(self, store: Store, runtime: FakeRuntime, clock: Clock) -> None:
        record = await activator(store, runtime, clock).create("alice", request())
        assert await store.live() == [record]

    async def test_unsecured_sandboxes_get_no_access_token(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        record = await activator(store, runtime, clock).create("alice", request(secure=False))
        assert record.access_token is None
        assert runtime.specs[record.id].init.access_token is None

    async def test_unknown_template_and_long_timeout_are_refused(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock, max_timeout=3600)
        with pytest.raises(TemplateNotFound):
            await act.create("alice", request(template="nope"))
        with pytest.raises(InvalidRequest):
            await act.create("alice", request(timeout=3601))
        assert runtime.calls == []

    async def test_aliases_resolve_to_their_template(self, store: Store, runtime: FakeRuntime, clock: Clock) -> None:
        act = activator(store, runtime, clock, template_aliases={"code-interpreter-v1": "base"})
        record = await act.create("alice", request(template="code-interpreter-v1"))
        assert (record.template, record.alias) == ("base", "code-interpreter-v1")

    async def test_a_failed_start_answers_an_error_and_leaves_no_sandbox(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        runtime.fail.add("start")
        act = activator(store, runtime, clock)
        with pytest.raises(ActivatorError, match="could not start"):
            await act.create("alice", request())
        assert await store.live() == []
        assert (await act.list("alice")).records == []


class TestTransitions:
    async def test_kill_is_idempotent(self, store: Store, runtime: FakeRuntime, clock: Clock) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request())
        await act.kill("alice", record.id)
        with pytest.raises(SandboxNotFound):
            await act.kill("alice", record.id)
        assert [call for call in runtime.calls if call[0] == "stop"] == [("stop", record.id)]
        assert await store.live() == []

    async def test_pause_snapshots_twice_conflicts_and_connect_restores(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request())
        await act.pause("alice", record.id)
        with pytest.raises(SandboxConflict):
            await act.pause("alice", record.id)
        paused = act.get("alice", record.id)
        assert (paused.state, paused.snapshot_kind, paused.reported_state) == ("snapshotted", "criu", "paused")
        assert record.id in runtime.snapshots
        assert record.id not in runtime.running
        resumed, was_paused = await act.connect("alice", record.id, 60)
        assert (resumed.state, was_paused, record.id in runtime.running) == (SandboxState.RUNNING, True, True)
        assert runtime.specs[record.id].init.access_token == record.access_token  # the restore got the init
        assert (await act.connect("alice", record.id, 60))[1] is False

    async def test_the_stored_record_says_snapshotted_once_pause_answers(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request())
        await act.pause("alice", record.id)
        (stored,) = await store.live()
        assert (stored.state, stored.pause_reason, stored.snapshot_kind) == ("snapshotted", "api", "criu")

    async def test_v1_resume_conflicts_unless_paused(self, store: Store, runtime: FakeRuntime, clock: Clock) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request())
        with pytest.raises(SandboxConflict):
            await act.resume("alice", record.id, 15)
        await act.pause("alice", record.id)
        assert (await act.resume("alice", record.id, 15)).state == SandboxState.RUNNING

    async def test_transitions_of_one_sandbox_run_one_at_a_time(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request())
        release = asyncio.Event()
        snapshot = runtime.snapshot

        async def slow_snapshot(sandbox_id: str, *, memory: bool = True) -> SnapshotInfo:
            await release.wait()
            return await snapshot(sandbox_id, memory=memory)

        runtime.snapshot = slow_snapshot  # type: ignore[method-assign]
        pausing = asyncio.create_task(act.pause("alice", record.id))
        killing = asyncio.create_task(act.kill("alice", record.id))
        await asyncio.sleep(0.01)
        assert ("stop", record.id) not in runtime.calls  # the kill waits for the pause to finish
        release.set()
        await asyncio.gather(pausing, killing)
        assert [name for name, _ in runtime.calls] == ["start", "snapshot", "stop"]

    async def test_a_failed_runtime_action_keeps_the_previous_state(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request())
        runtime.fail.add("snapshot")
        with pytest.raises(ActivatorError, match="could not snapshot"):
            await act.pause("alice", record.id)
        assert act.get("alice", record.id) == record
        assert await store.live() == [record]


class TestTimeouts:
    async def test_the_reaper_kills_past_the_deadline(self, store: Store, runtime: FakeRuntime, clock: Clock) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request(timeout=60))
        clock.advance(59)
        await act.reap_once()
        assert act.get("alice", record.id).state == SandboxState.RUNNING
        clock.advance(1)
        await act.reap_once()
        with pytest.raises(SandboxNotFound):
            act.get("alice", record.id)
        assert record.id not in runtime.running

    async def test_the_reaper_pauses_when_the_lifecycle_says_so(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request(timeout=60, lifecycle=Lifecycle(on_timeout="pause")))
        clock.advance(61)
        await act.reap_once()
        paused = act.get("alice", record.id)
        assert (paused.state, paused.pause_reason, paused.reported_state) == ("snapshotted", "timeout", "paused")
        assert record.id in runtime.snapshots
        clock.advance(10_000)
        await act.reap_once()
        assert act.get("alice", record.id).state == SandboxState.SNAPSHOTTED

    async def test_time_spent_paused_does_not_count(self, store: Store, runtime: FakeRuntime, clock: Clock) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request(timeout=100))
        clock.advance(40)
        await act.pause("alice", record.id)
        clock.advance(5000)
        resumed, _ = await act.connect("alice", record.id, 10)
        assert resumed.end_at == clock.now + 60

    async def test_set_timeout_may_shorten_and_the_reaper_follows(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request(timeout=3600))
        await act.set_timeout("alice", record.id, 5)
        await act.refresh("alice", record.id, 1)
        clock.advance(6)
        await act.reap_once()
        assert await store.live() == []

    async def test_killed_records_are_purged_after_the_retention(
        self, store: Store, runtime: FakeRuntime, clock: Clock
    ) -> None:
        act = activator(store, runtime, clock, killed_retention=60)
        record = await act.create("alice", request())
        await act.kill("alice", record.id)
        await act.reap_once()
        assert await store.purge_killed(clock.now + 1) == 1  # still there after the first pass
        again = await act.create("alice", request())
        await act.kill("alice", again.id)
        clock.advance(61)
        await act.reap_once()
        assert await store.purge_killed(clock.now) == 0


class TestOwnership:
    async def test_another_key_sees_nothing(self, store: Store, runtime: FakeRuntime, clock: Clock) -> None:
        act = activator(store, runtime, clock)
        record = await act.create("alice", request())
        with pytest.raises(SandboxNotFound):
            act.get("mallory", record.id)
        with pytest.raises(SandboxNotFound):
            await act.kill("mallory", record.id)
        with pytest.raises(SandboxNotFound):
            await act.connect("mallory", record.id, 10)
        assert (await act.list("mallory")).records == []
        assert act.get("alice", record.id).state == SandboxState.RUNNING


async def test_metrics_come_from_the_runtime(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request())
    at, stats = await act.metrics("alice", record.id)
    assert stats is not None
    assert (at, stats.cpu_used_pct) == (clock.now, 12.5)


async def test_a_snapshotted_sandbox_has_no_metrics(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock)
    record = await act.create("alice", request())
    await act.pause("alice", record.id)
    assert await act.metrics("alice", record.id) == (clock.now, None)


async def test_listing_reports_idle_pauses_as_running(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock, template("base", pause_after=10))
    idle, paused, running = [await act.create("alice", request()) for _ in range(3)]
    await act.pause("alice", paused.id)
    clock.advance(5)
    act.touch(running.id)
    clock.advance(6)
    await act.reap_once()
    assert act.get("alice", idle.id).state == SandboxState.PAUSED
    listed = {r.id for r in (await act.list("alice", states={SandboxState.RUNNING})).records}
    assert listed == {idle.id, running.id}
    assert [r.id for r in (await act.list("alice", states={SandboxState.PAUSED})).records] == [paused.id]


async def test_a_sandbox_mid_transition_is_listed_as_get_answers(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    """The store holds a transition's target from its start on: the listings (the UI's, E2B's) must not show a
    pause or a resume before `get` (E2B's get_info) does, that is before it is done."""
    act = activator(store, runtime, clock)
    sandbox_id = (await act.create("alice", request())).id

    async def stored_ahead() -> bool:
        stored = await store.get(sandbox_id)
        return stored is not None and stored.state is not act.get("alice", sandbox_id).state

    for method, transition, reported in (
        ("snapshot", lambda: act.pause("alice", sandbox_id), SandboxState.RUNNING),
        ("restore", lambda: act.connect("alice", sandbox_id, 60), SandboxState.PAUSED),
    ):
        release = held(runtime, method)
        under_way = asyncio.create_task(transition())
        await wait_for_async(stored_ahead, what=f"the {method} to be stored")
        assert act.get("alice", sandbox_id).reported_state is reported
        assert [r.id for r in (await act.list("alice", states={reported})).records] == [sandbox_id]
        assert [r.reported_state for r in (await act.list("alice")).records] == [reported]
        release.set()
        await under_way


async def test_logs_record_the_lifecycle(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    act = activator(store, runtime, clock, log_lines=2)
    record = await act.create("alice", request())
    await act.pause("alice", record.id)
    await act.connect("alice", record.id, 10)
    assert [line.message for line in act.logs("alice", record.id)] == ["paused (api)", "resumed with 300 s to live"]
