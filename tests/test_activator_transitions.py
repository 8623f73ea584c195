"""The state machine's rules, as a pure function: each intent on each state."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from activator import Lifecycle, SandboxConflict, SandboxNotFound, SandboxRecord, SandboxState
from activator._transitions import Expire, Kill, Pause, Reassert, Resume, SetTimeout, Start, plan

NOW = 1000.0


def record(state: SandboxState = SandboxState.RUNNING, **changes: object) -> SandboxRecord:
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


class TestStartAndKill:
    def test_start_starts_a_new_record(self) -> None:
        step = plan(None, Start(record()), NOW)
        assert (step.record, step.action) == (record(), "start")

    def test_start_of_an_existing_sandbox_does_nothing(self) -> None:
        assert plan(record(), Start(record(end_at=1.0)), NOW) == (record(), None, None)

    @pytest.mark.parametrize("state", [SandboxState.RUNNING, SandboxState.PAUSED])
    def test_kill_stops_and_records_the_time(self, state: SandboxState) -> None:
        step = plan(record(state), Kill(), NOW)
        assert (step.record.state, step.record.end_at, step.action) == (SandboxState.KILLED, NOW, "stop")

    @pytest.mark.parametrize("current", [None, record(SandboxState.KILLED)])
    def test_every_intent_on_a_missing_sandbox_is_not_found(self, current: SandboxRecord | None) -> None:
        for intent in (Kill(), Pause(), Resume(1), SetTimeout(1), Expire(), Reassert()):
            with pytest.raises(SandboxNotFound):
                plan(current, intent, NOW)


class TestPauseAndResume:
    def test_pause_keeps_the_remaining_ttl(self) -> None:
        step = plan(record(), Pause(), NOW)
        assert (step.record.state, step.record.remaining, step.action) == (SandboxState.PAUSED, 100, "freeze")

    def test_pause_of_a_paused_sandbox_conflicts(self) -> None:
        with pytest.raises(SandboxConflict):
            plan(record(SandboxState.PAUSED), Pause(), NOW)

    def test_resume_grants_the_longer_of_remaining_and_timeout(self) -> None:
        paused = record(SandboxState.PAUSED, remaining=100.0, pause_reason="api")
        assert plan(paused, Resume(30), NOW).record.end_at == NOW + 100
        step = plan(paused, Resume(500), NOW)
        assert (step.record.end_at, step.record.started_at, step.action) == (NOW + 500, NOW, "thaw")
        assert (step.record.state, step.record.pause_reason) == (SandboxState.RUNNING, None)

    def test_connect_to_a_running_sandbox_only_lengthens_its_ttl(self) -> None:
        assert plan(record(), Resume(10), NOW) == (record(), None, None)
        assert plan(record(), Resume(500), NOW) == (record(end_at=NOW + 500), None, None)

    def test_v1_resume_of_a_running_sandbox_conflicts(self) -> None:
        with pytest.raises(SandboxConflict):
            plan(record(), Resume(10, only_if_paused=True), NOW)


class TestTimeouts:
    def test_set_timeout_overwrites_even_when_shorter(self) -> None:
        assert plan(record(), SetTimeout(5), NOW).record.end_at == NOW + 5

    def test_extend_only_never_shortens(self) -> None:
        assert plan(record(), SetTimeout(5, extend_only=True), NOW).record.end_at == NOW + 100

    def test_set_timeout_of_a_paused_sandbox_sets_its_remaining_ttl(self) -> None:
        assert plan(record(SandboxState.PAUSED, remaining=50.0), SetTimeout(7), NOW).record.remaining == 7

    def test_expire_before_the_deadline_does_nothing(self) -> None:
        assert plan(record(), Expire(), NOW).action is None

    def test_expire_after_the_deadline_kills(self) -> None:
        step = plan(record(end_at=NOW), Expire(), NOW)
        assert (step.record.state, step.action) == (SandboxState.KILLED, "stop")

    def test_expire_pauses_when_the_lifecycle_says_so(self) -> None:
        step = plan(record(end_at=NOW - 1, lifecycle=Lifecycle(on_timeout="pause")), Expire(), NOW)
        assert (step.record.state, step.record.pause_reason, step.record.remaining) == (
            SandboxState.PAUSED,
            "timeout",
            0,
        )

    def test_paused_time_does_not_expire(self) -> None:
        assert plan(record(SandboxState.PAUSED, end_at=0.0), Expire(), NOW).action is None


def test_reassert_repeats_the_action_the_state_needs() -> None:
    assert plan(record(), Reassert(), NOW).action == "thaw"
    assert plan(record(SandboxState.PAUSED), Reassert(), NOW).action == "freeze"
