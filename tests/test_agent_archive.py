"""The control plane's copy of coding-agent sessions on disk (`AgentArchive`): what the mirror appends is read
back with the sandbox's offsets, by its key only, across a reopen; it refuses events out of order and names it
cannot trust, stops at its size and session limits, reads as ended once its sandbox ended, and is deleted
`retention` seconds after that (a copy left unreadable by a crash too)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from activator import AgentArchive, SandboxNotFound
from executor.agent_api import SessionInfo, UniversalEvent
from tests.test_activator_fakes import Clock


def info(session_id: str = "s1", *, count: int = 0, created_at: str = "2026-12-04T08:00:00Z") -> SessionInfo:
    return SessionInfo(session_id=session_id, agent="mock", created_at=created_at, ended=False, event_count=count)


def event(sequence: int, session_id: str = "s1") -> UniversalEvent:
    return UniversalEvent(
        event_id=f"e{sequence}", sequence=sequence, time="2026-12-04T08:00:00Z", session_id=session_id,
        native_session_id=None, source="agent", synthetic=False, type="item.delta", data={"delta": "x" * sequence},
    )  # fmt: skip


@pytest.fixture
def archive(tmp_path: Path, clock: Clock) -> AgentArchive:
    return AgentArchive(tmp_path / "agent-sessions", retention=60.0, clock=clock)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_events_kept_are_read_from_any_offset_after_a_reopen(archive: AgentArchive, clock: Clock) -> None:
    assert archive.keep("sbx1", "key1", "base", info(count=3), [event(1), event(2), event(3)])
    assert archive.keep("sbx1", "key1", "base", info(count=5), [event(4), event(5)])
    again = AgentArchive(archive.root, clock=clock)
    assert again.length("sbx1", "s1") == 5
    page = again.events("key1", "sbx1", "s1", 2, 2)
    assert ([e.sequence for e in page.events], page.has_more) == ([3, 4], True)
    assert again.events("key1", "sbx1", "s1", 4, 10).has_more is False
    assert again.events("key1", "sbx1", "s1", 0, 10).events == [event(n) for n in range(1, 6)]
    assert again.sessions("key1", "sbx1") == [info(count=5)]
    assert archive.keep("sbx1", "key1", "base", info(count=9), [])
    assert again.sessions("key1", "sbx1") == [info(count=5)]  # eventCount: what is kept, not what the sandbox said


def test_another_keys_copy_is_not_found(archive: AgentArchive) -> None:
    archive.keep("sbx1", "key1", "base", info(), [event(1)])
    archive.keep("sbx2", "key2", "base", info("s2"), [event(1, "s2")])
    with pytest.raises(SandboxNotFound):
        archive.sessions("key2", "sbx1")
    with pytest.raises(SandboxNotFound):
        archive.events("key2", "sbx1", "s1", 0, 10)
    assert [(kept.sandbox_id, kept.info.session_id) for kept in archive.across("key1")] == [("sbx1", "s1")]


def test_sessions_across_sandboxes_are_listed_newest_first(archive: AgentArchive) -> None:
    archive.keep("sbx1", "key1", "base", info("old", created_at="2026-12-04T08:00:00Z"), [])
    archive.keep("sbx2", "key1", "desktop", info("new", created_at="2026-12-04T09:00:00Z"), [])
    listed = archive.across("key1")
    assert [(kept.sandbox_id, kept.sandbox.template, kept.info.session_id) for kept in listed] == [
        ("sbx2", "desktop", "new"), ("sbx1", "base", "old"),
    ]  # fmt: skip


def test_events_out_of_order_and_untrusted_names_are_refused(archive: AgentArchive) -> None:
    archive.keep("sbx1", "key1", "base", info(), [event(1)])
    with pytest.raises(ValueError, match="does not follow"):
        archive.keep("sbx1", "key1", "base", info(), [event(3)])
    with pytest.raises(ValueError, match="not a session id"):
        archive.keep("sbx1", "key1", "base", info("../escape"), [])
    assert not (archive.root / "escape").exists()
    with pytest.raises(SandboxNotFound):
        archive.info("key1", "sbx1", "../sbx1")
    with pytest.raises(SandboxNotFound):
        archive.sandbox("key1", "..")


def test_a_full_copy_keeps_its_first_events_and_says_it_is_truncated(tmp_path: Path) -> None:
    archive = AgentArchive(tmp_path, max_bytes=600)
    assert not archive.keep("sbx1", "key1", "base", info(), [event(n) for n in range(1, 10)])
    kept = archive.length("sbx1", "s1")
    assert 0 < kept < 9
    assert archive.full("sbx1")
    assert archive.sandbox("key1", "sbx1").truncated
    assert [e.sequence for e in archive.events("key1", "sbx1", "s1", 0, 100).events] == list(range(1, kept + 1))
    assert not archive.keep("sbx1", "key1", "base", info("s2"), [])  # nothing more, not even a new session


def test_a_copy_takes_max_sessions_and_then_no_new_one(tmp_path: Path) -> None:
    archive = AgentArchive(tmp_path, max_sessions=2)
    assert archive.keep("sbx1", "key1", "base", info("s1"), [event(1)])
    assert archive.keep("sbx1", "key1", "base", info("s2"), [])
    assert not archive.keep("sbx1", "key1", "base", info("s3"), [])
    assert archive.sandbox("key1", "sbx1").truncated
    assert {kept.session_id for kept in archive.sessions("key1", "sbx1")} == {"s1", "s2"}


def test_an_ended_sandboxs_sessions_read_as_ended(archive: AgentArchive) -> None:
    running = msgspec.structs.replace(info(count=1), turn_active=True, pending_permissions=["p1"])
    archive.keep("sbx1", "key1", "base", running, [event(1)])
    assert archive.info("key1", "sbx1", "s1") == running
    archive.ended("sbx1")
    ended = msgspec.structs.replace(running, ended=True, turn_active=False, pending_permissions=[])
    assert archive.info("key1", "sbx1", "s1") == ended
    assert archive.sessions("key1", "sbx1") == [ended]
    assert [kept.info for kept in archive.across("key1")] == [ended]


def test_a_copy_is_deleted_retention_seconds_after_its_sandbox_ended(archive: AgentArchive, clock: Clock) -> None:
    archive.keep("sbx1", "key1", "base", info(), [event(1)])
    archive.keep("sbx2", "key1", "base", info(), [event(1)])
    archive.ended("sbx1")
    assert archive.sandbox("key1", "sbx1").ended_at == clock()
    clock.advance(59)
    assert archive.prune() == 0
    clock.advance(2)
    archive.ended("sbx1")  # ended again (a sweep): the time it ended first stays
    assert archive.prune(keep={"sbx2"}) == 1
    assert archive.sandbox_ids() == ["sbx2"]  # never ended: kept
    with pytest.raises(SandboxNotFound):
        archive.sessions("key1", "sbx1")


def test_a_copy_left_without_its_record_is_pruned_after_retention(archive: AgentArchive, clock: Clock) -> None:
    archive.keep("sbx1", "key1", "base", info(), [event(1)])
    (archive.root / "sbx1" / "sandbox.json").unlink()  # a crash between the directory and its record
    os.utime(archive.root / "sbx1", (clock(), clock()))
    clock.advance(59)
    assert archive.prune() == 0
    clock.advance(2)
    assert archive.prune() == 1
    assert archive.sandbox_ids() == []


def test_no_retention_deletes_a_copy_when_its_sandbox_ends(tmp_path: Path) -> None:
    archive = AgentArchive(tmp_path, retention=0)
    archive.keep("sbx1", "key1", "base", info(), [event(1)])
    archive.ended("sbx1")
    assert archive.sandbox_ids() == []


def _events(count: int, first: int = 1) -> list[UniversalEvent]:
    """`count` events of about 1 KiB each, from sequence `first` on."""
    return [msgspec.structs.replace(event(n), data={"delta": "y" * 1000}) for n in range(first, first + count)]


def test_all_copies_keep_within_the_total_by_deleting_the_longest_ended_copy_first(
    tmp_path: Path, clock: Clock
) -> None:
    archive = AgentArchive(tmp_path, max_total_bytes=12_000, clock=clock)
    for sandbox_id in ("sbx1", "sbx2", "sbx3"):
        assert archive.keep(sandbox_id, "key1", "base", info(), _events(3))
    archive.ended("sbx2")
    clock.advance(1)
    archive.ended("sbx1")  # ended later than sbx2, though copied first
    assert archive.keep("sbx3", "key1", "base", info(), _events(3, first=4))
    assert archive.sandbox_ids() == ["sbx1", "sbx3"]  # sbx2, the longest ended, made room; retention is not up
    assert archive.total() <= 12_000
    assert not archive.keep("sbx3", "key1", "base", info(), _events(6, first=7))  # sbx1 goes, and still no room
    assert archive.sandbox_ids() == ["sbx3"]
    assert archive.sandbox("key1", "sbx3").truncated  # a live sandbox's copy is never deleted: it stops growing
    kept = archive.length("sbx3", "s1")
    assert 6 < kept < 12
    assert [e.sequence for e in archive.events("key1", "sbx3", "s1", 0, 100).events] == list(range(1, kept + 1))
    assert archive.total() == sum(path.stat().st_size for path in tmp_path.glob("*/sessions/*/*")) <= 12_000


def test_a_smaller_total_after_a_restart_is_kept_by_the_next_prune(tmp_path: Path, clock: Clock) -> None:
    archive = AgentArchive(tmp_path, clock=clock)
    for sandbox_id in ("sbx1", "sbx2", "sbx3"):
        archive.keep(sandbox_id, "key1", "base", info(), _events(3))
        archive.ended(sandbox_id)
        clock.advance(1)
    restarted = AgentArchive(tmp_path, max_total_bytes=9_000, clock=clock)
    assert restarted.prune(keep={"sbx1"}) == 0  # none is past its retention
    assert restarted.sandbox_ids() == ["sbx1", "sbx3"]  # sbx1 is live again (a kill that failed): kept
    assert restarted.total() <= 9_000
