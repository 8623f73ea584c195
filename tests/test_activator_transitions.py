"""The state machine's rules, as a pure function: each intent on each state."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from activator import Lifecycle, SandboxConflict, SandboxNotFound, SandboxRecord, SandboxState
from activator._transitions import (
    Crash,
    Expire,
    IdleFreeze,
    IdleSnapshot,
    Intent,
    Kill,
    Pause,
    Reassert,
    Resume,
    SetTimeout,
    Start,
    Wake,
    plan,
)

NOW = 1000.0
RUNNING, PAUSED, SNAPSHOTTED, KILLED = (
    SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.SNAPSHOTTED, SandboxState.KILLED,
)  # fmt: skip
WAKES = Lifecycle(on_timeout="pause", auto_resume=True)


def record(state: SandboxState = RUNNING, **changes: object) -> SandboxRecord:
    base = SandboxRecord(
        id="abc",
        owner="key",
        template="base",
        alias="base",
        state=state,
        created_at=0.0,
        started_at=0.0,
        end_at=NOW + 100,
        timeout=300.0,
    )
    return replace(base, **changes)


def idle(state: SandboxState, **changes: object) -> SandboxRecord:
    return record(state, pause_reason="idle", **changes)


def user_paused(state: SandboxState = SNAPSHOTTED, **changes: object) -> SandboxRecord:
    return record(state, **{"pause_reason": "api", "remaining": 100.0, **changes})


class TestStartAndKill:
    def test_start_starts_a_new_record(self) -> None:
        step = plan(None, Start(record()), NOW)
        assert (step.record, step.action) == (record(), "start")

    def test_start_of_an_existing_sandbox_does_nothing(self) -> None:
        assert plan(record(), Start(record(end_at=1.0)), NOW)[:3] == (record(), None, None)

    @pytest.mark.parametrize("current", [record(), idle(PAUSED), idle(SNAPSHOTTED), user_paused()])
    def test_kill_stops_from_every_live_state(self, current: SandboxRecord) -> None:
        step = plan(current, Kill(), NOW)
        assert (step.record.state, step.record.end_at, step.action) == (KILLED, NOW, "stop")

    @pytest.mark.parametrize("current", [None, record(KILLED)])
    def test_every_intent_on_a_missing_sandbox_is_not_found(self, current: SandboxRecord | None) -> None:
        intents: list[Intent] = [
            Kill(), Pause(), IdleFreeze(), IdleSnapshot(), Resume(1), Wake(), SetTimeout(1), Expire(),
            Reassert(alive=True, snapshotted=False),
        ]  # fmt: skip
        for intent in intents:
            with pytest.raises(SandboxNotFound):
                plan(current, intent, NOW)

    def test_a_step_remembers_where_it_started(self) -> None:
        assert plan(record(), Kill(), NOW).before == record()


class TestCrash:
    @pytest.mark.parametrize("current", [record(), idle(PAUSED), user_paused(PAUSED)])
    def test_a_crash_keeps_the_files_as_a_user_pause_with_its_ttl_stopped_and_says_why(
        self, current: SandboxRecord
    ) -> None:
        step = plan(current, Crash("its pid 1 ended"), NOW)
        crashed = step.record
        assert (crashed.state, crashed.snapshot_kind, crashed.pause_reason) == (SNAPSHOTTED, "filesystem", "crash")
        assert crashed.crash == "its pid 1 ended"
        assert crashed.user_paused  # E2B reports it paused
        assert crashed.remaining == (100.0 if current.user_paused else current.end_at - NOW)
        assert step.action is None  # the runtime has kept the files already
        assert step.log is not None
        assert step.log.startswith("crashed: its pid 1 ended")

    def test_a_connect_starts_it_again_over_its_files_and_forgets_the_crash(self) -> None:
        crashed = plan(record(), Crash("gone"), NOW).record
        step = plan(crashed, Resume(60), NOW)
        assert (step.record.state, step.action, step.memory) == (RUNNING, "restore", False)
        assert (step.record.crash, step.record.pause_reason) == (None, None)

    def test_the_end_of_a_snapshotted_sandbox_changes_nothing(self) -> None:
        assert plan(idle(SNAPSHOTTED), Crash("late"), NOW)[:3] == (idle(SNAPSHOTTED), None, None)


class TestE2BPause:
    def test_pause_snapshots_and_keeps_the_remaining_ttl(self) -> None:
        step = plan(record(), Pause(), NOW)
        assert (step.record.state, step.record.pause_reason, step.action) == (SNAPSHOTTED, "api", "snapshot")
        assert step.record.remaining == 100

    def test_pause_of_an_idle_frozen_sandbox_snapshots_it(self) -> None:
        step = plan(idle(PAUSED), Pause(), NOW)
        assert (step.record.state, step.record.pause_reason, step.action) == (SNAPSHOTTED, "api", "snapshot")

    def test_pause_of_an_idle_snapshotted_sandbox_only_changes_its_reason(self) -> None:
        step = plan(idle(SNAPSHOTTED), Pause(), NOW)
        assert (step.record.state, step.record.pause_reason, step.action) == (SNAPSHOTTED, "api", None)
        assert step.record.remaining == 100

    @pytest.mark.parametrize("reason", ["api", "timeout"])
    def test_pause_of_a_user_paused_sandbox_conflicts(self, reason: str) -> None:
        with pytest.raises(SandboxConflict):
            plan(record(SNAPSHOTTED, pause_reason=reason), Pause(), NOW)


class TestIdlePolicy:
    def test_idle_freeze_freezes_a_running_sandbox_only(self) -> None:
        step = plan(record(), IdleFreeze(), NOW)
        assert (step.record.state, step.record.pause_reason, step.action) == (PAUSED, "idle", "freeze")
        assert step.record.end_at == record().end_at  # the TTL keeps running: the pause is transparent
        for other in (idle(PAUSED), idle(SNAPSHOTTED), user_paused()):
            assert plan(other, IdleFreeze(), NOW).action is None

    @pytest.mark.parametrize("current", [record(), idle(PAUSED)])
    def test_idle_snapshot_scales_running_and_frozen_sandboxes_to_zero(self, current: SandboxRecord) -> None:
        step = plan(current, IdleSnapshot(), NOW)
        assert (step.record.state, step.record.pause_reason, step.action) == (SNAPSHOTTED, "idle", "snapshot")

    @pytest.mark.parametrize("current", [idle(SNAPSHOTTED), user_paused(), user_paused(PAUSED)])
    def test_idle_snapshot_leaves_snapshotted_and_user_paused_ones_alone(self, current: SandboxRecord) -> None:
        assert plan(current, IdleSnapshot(), NOW).action is None


class TestResume:
    @pytest.mark.parametrize(("state", "action"), [(PAUSED, "thaw"), (SNAPSHOTTED, "restore")])
    def test_resume_of_a_user_paused_sandbox_grants_the_longer_ttl(self, state: SandboxState, action: str) -> None:
        assert plan(user_paused(state), Resume(30), NOW).record.end_at == NOW + 100
        step = plan(user_paused(state), Resume(500), NOW)
        assert (step.record.end_at, step.record.started_at, step.action) == (NOW + 500, NOW, action)
        assert (step.record.state, step.record.pause_reason, step.record.remaining) == (RUNNING, None, 0)

    def test_connect_to_a_running_sandbox_only_lengthens_its_ttl(self) -> None:
        assert plan(record(), Resume(10), NOW)[:3] == (record(), None, None)
        assert plan(record(), Resume(500), NOW)[:3] == (record(end_at=NOW + 500), None, None)

    @pytest.mark.parametrize(("state", "action"), [(PAUSED, "thaw"), (SNAPSHOTTED, "restore")])
    def test_connect_wakes_an_idle_sandbox_keeping_its_start(self, state: SandboxState, action: str) -> None:
        step = plan(idle(state, snapshot_kind="criu"), Resume(10), NOW)
        assert (step.record.state, step.action, step.record.started_at) == (RUNNING, action, 0.0)
        assert (step.record.end_at, step.record.snapshot_kind) == (NOW + 100, None)

    @pytest.mark.parametrize("current", [record(), idle(PAUSED), idle(SNAPSHOTTED)])
    def test_v1_resume_of_a_sandbox_reported_running_conflicts(self, current: SandboxRecord) -> None:
        with pytest.raises(SandboxConflict):
            plan(current, Resume(10, only_if_paused=True), NOW)


class TestWake:
    def test_traffic_leaves_a_running_sandbox_alone(self) -> None:
        assert plan(record(), Wake(), NOW).action is None

    @pytest.mark.parametrize(("state", "action"), [(PAUSED, "thaw"), (SNAPSHOTTED, "restore")])
    def test_traffic_wakes_an_idle_sandbox_without_lengthening_its_ttl(self, state: SandboxState, action: str) -> None:
        step = plan(idle(state), Wake(), NOW)
        assert (step.record.state, step.action, step.record.end_at) == (RUNNING, action, NOW + 100)

    def test_traffic_wakes_a_user_paused_sandbox_only_with_auto_resume(self) -> None:
        with pytest.raises(SandboxNotFound, match="does not auto-resume"):
            plan(user_paused(), Wake(), NOW)
        step = plan(user_paused(lifecycle=WAKES, remaining=0.0), Wake(), NOW)
        assert (step.record.state, step.action, step.record.end_at) == (RUNNING, "restore", NOW + 300)


class TestTimeouts:
    def test_set_timeout_overwrites_even_when_shorter(self) -> None:
        assert plan(record(), SetTimeout(5), NOW).record.end_at == NOW + 5
        assert plan(idle(SNAPSHOTTED), SetTimeout(5), NOW).record.end_at == NOW + 5

    def test_extend_only_never_shortens(self) -> None:
        assert plan(record(), SetTimeout(5, extend_only=True), NOW).record.end_at == NOW + 100

    def test_set_timeout_of_a_user_paused_sandbox_sets_its_remaining_ttl(self) -> None:
        assert plan(user_paused(), SetTimeout(7), NOW).record.remaining == 7

    def test_expire_before_the_deadline_does_nothing(self) -> None:
        assert plan(record(), Expire(), NOW).action is None

    @pytest.mark.parametrize("current", [record(end_at=NOW), idle(PAUSED, end_at=NOW), idle(SNAPSHOTTED, end_at=NOW)])
    def test_expire_after_the_deadline_kills_even_idle_paused_ones(self, current: SandboxRecord) -> None:
        step = plan(current, Expire(), NOW)
        assert (step.record.state, step.action) == (KILLED, "stop")

    @pytest.mark.parametrize(("current", "action"), [(record(), "snapshot"), (idle(SNAPSHOTTED), None)])
    def test_expire_pauses_when_the_lifecycle_says_so(self, current: SandboxRecord, action: str | None) -> None:
        step = plan(replace(current, end_at=NOW - 1, lifecycle=WAKES), Expire(), NOW)
        assert (step.record.state, step.record.pause_reason, step.record.remaining) == (SNAPSHOTTED, "timeout", 0)
        assert step.action == action

    def test_user_paused_time_does_not_expire(self) -> None:
        assert plan(user_paused(end_at=0.0), Expire(), NOW).action is None


class TestReassert:
    @pytest.mark.parametrize(("state", "action"), [(RUNNING, "thaw"), (PAUSED, "freeze"), (SNAPSHOTTED, "snapshot")])
    def test_live_processes_are_brought_in_line_with_the_record(self, state: SandboxState, action: str) -> None:
        step = plan(record(state), Reassert(alive=True, snapshotted=False), NOW)
        assert (step.record.state, step.action) == (state, action)

    def test_a_restore_cut_short_is_finished(self) -> None:
        assert plan(record(), Reassert(alive=False, snapshotted=True), NOW).action == "restore"

    @pytest.mark.parametrize("state", [PAUSED, SNAPSHOTTED])
    def test_a_snapshot_without_processes_stays_resumable(self, state: SandboxState) -> None:
        step = plan(user_paused(state), Reassert(alive=False, snapshotted=True), NOW)
        assert (step.record.state, step.record.pause_reason, step.action) == (SNAPSHOTTED, "api", None)

    @pytest.mark.parametrize("state", [RUNNING, PAUSED])
    def test_a_sandbox_found_dead_with_its_files_kept_is_a_crash_not_a_restore(self, state: SandboxState) -> None:
        step = plan(record(state), Reassert(alive=False, snapshotted=True, crash="pid 1 ended"), NOW)
        assert (step.record.state, step.record.pause_reason, step.record.crash) == (SNAPSHOTTED, "crash", "pid 1 ended")
        assert step.action is None
        assert step.record.user_paused

    def test_a_sandbox_found_dead_after_its_timeout_passed_gets_what_its_lifecycle_says(self) -> None:
        dead = Reassert(alive=False, snapshotted=True, crash="pid 1 ended")
        assert plan(record(end_at=NOW - 1), dead, NOW).record.state == KILLED
        paused = plan(replace(record(end_at=NOW - 1), lifecycle=WAKES), dead, NOW).record
        assert (paused.state, paused.pause_reason) == (SNAPSHOTTED, "timeout")

    def test_a_sandbox_found_dead_while_it_was_being_snapshotted_is_just_snapshotted(self) -> None:
        step = plan(user_paused(SNAPSHOTTED), Reassert(alive=False, snapshotted=True, crash="gone"), NOW)
        assert (step.record.pause_reason, step.record.crash, step.action) == ("api", None, None)

    @pytest.mark.parametrize("state", [RUNNING, PAUSED, SNAPSHOTTED])
    def test_a_sandbox_with_neither_processes_nor_snapshot_is_killed(self, state: SandboxState) -> None:
        step = plan(record(state), Reassert(alive=False, snapshotted=False), NOW)
        assert (step.record.state, step.action) == (KILLED, "stop")


class TestReportedState:
    @pytest.mark.parametrize(
        ("current", "reported"),
        [(record(), RUNNING), (idle(PAUSED), RUNNING), (idle(SNAPSHOTTED), RUNNING), (user_paused(), PAUSED)],
    )
    def test_an_idle_pause_is_reported_as_running(self, current: SandboxRecord, reported: SandboxState) -> None:
        assert current.reported_state == reported


class TestFilesOnly:
    """E2B's `memory: false`: a pause that keeps files only, a resume that boots from them (a cold start)."""

    @pytest.mark.parametrize("current", [record(), idle(PAUSED)])
    def test_a_files_only_pause_snapshots_without_memory(self, current: SandboxRecord) -> None:
        step = plan(current, Pause(memory=False), NOW)
        assert (step.action, step.memory, step.record.snapshot_kind) == ("snapshot", False, "filesystem")

    def test_a_files_only_pause_of_an_idle_memory_snapshot_marks_its_image_dropped(self) -> None:
        paused = plan(idle(SNAPSHOTTED, snapshot_kind="criu"), Pause(memory=False), NOW).record
        assert (paused.pause_reason, paused.snapshot_kind) == ("api", "filesystem")
        step = plan(paused, Resume(10), NOW)
        assert (step.action, step.memory) == ("restore", False)

    def test_a_reboot_of_a_user_paused_memory_snapshot_restores_its_files_only(self) -> None:
        step = plan(user_paused(snapshot_kind="criu"), Resume(10, memory=False), NOW)
        assert (step.action, step.memory, step.record.state) == ("restore", False, RUNNING)
        assert plan(user_paused(snapshot_kind="criu"), Resume(10), NOW).memory

    def test_a_reboot_of_an_idle_snapshot_keeps_its_memory_the_client_never_saw_paused(self) -> None:
        step = plan(idle(SNAPSHOTTED, snapshot_kind="criu"), Resume(10, memory=False), NOW)
        assert (step.action, step.memory) == ("restore", True)

    def test_a_files_only_snapshot_cut_short_is_finished_files_only(self) -> None:
        current = user_paused(snapshot_kind="filesystem")
        step = plan(current, Reassert(alive=True, snapshotted=False), NOW)
        assert (step.action, step.memory) == ("snapshot", False)
