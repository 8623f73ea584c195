"""The UI's session table: opaque ids, absolute and idle expiry, sign-out, revocation, and its size cap."""

from __future__ import annotations

import pytest

from gateway.ui import SessionStore
from tests.test_activator_fakes import Clock


def test_a_session_id_is_random_and_is_not_what_the_table_keys_on() -> None:
    sessions = SessionStore()
    first, second = sessions.create("key1", "name"), sessions.create("key1", "name")
    assert first != second
    assert len(first) >= 40
    assert first not in sessions._sessions  # stored under its digest only


def test_a_session_ends_after_its_lifetime_even_when_used() -> None:
    clock = Clock()
    sessions = SessionStore(lifetime=100, idle=60, clock=clock)
    token = sessions.create("key1", "")
    for _ in range(3):
        clock.advance(30)
        assert sessions.get(token) is not None
    clock.advance(10)
    assert sessions.get(token) is None


def test_a_session_ends_when_idle_and_use_keeps_it_alive() -> None:
    clock = Clock()
    sessions = SessionStore(lifetime=1000, idle=60, clock=clock)
    token = sessions.create("key1", "")
    clock.advance(59)
    assert sessions.get(token) is not None
    clock.advance(60)
    assert sessions.get(token) is None


def test_sign_out_and_revocation_end_sessions_at_once() -> None:
    sessions = SessionStore()
    mine, other, theirs = sessions.create("key1", ""), sessions.create("key1", ""), sessions.create("key2", "")
    sessions.drop(mine)
    assert sessions.get(mine) is None
    sessions.drop_owner("key1")
    assert sessions.get(other) is None
    assert sessions.get(theirs) is not None


def test_unknown_and_missing_ids_find_nothing() -> None:
    sessions = SessionStore()
    sessions.create("key1", "")
    assert sessions.get(None) is None
    assert sessions.get("") is None
    assert sessions.get("not-a-session") is None


def test_the_oldest_sign_in_gives_way_past_the_cap() -> None:
    sessions = SessionStore(max_sessions=2)
    oldest, middle, newest = (sessions.create(f"key{n}", "") for n in range(3))
    assert sessions.get(oldest) is None
    assert sessions.get(middle) is not None
    assert sessions.get(newest) is not None
    assert len(sessions) == 2


def test_nonsense_limits_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="lifetime"):
        SessionStore(idle=0)
