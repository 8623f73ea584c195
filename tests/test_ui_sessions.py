"""The UI's session table: opaque ids, absolute and idle expiry, sign-out, revocation, and its size cap."""

from __future__ import annotations

import pytest

from gateway.ui import SessionStore
from tests.test_activator_fakes import Clock

pytestmark = pytest.mark.anyio


async def test_a_session_id_is_random_and_is_not_what_the_table_keys_on() -> None:
    sessions = SessionStore()
    first, second = await sessions.create("key1", "name"), await sessions.create("key1", "name")
    assert first != second
    assert len(first) >= 40
    assert first not in sessions._sessions  # stored under its digest only


async def test_a_session_ends_after_its_lifetime_even_when_used() -> None:
    clock = Clock()
    sessions = SessionStore(lifetime=100, idle=60, clock=clock)
    token = await sessions.create("key1", "")
    for _ in range(3):
        clock.advance(30)
        assert await sessions.get(token) is not None
    clock.advance(10)
    assert await sessions.get(token) is None


async def test_a_session_ends_when_idle_and_use_keeps_it_alive() -> None:
    clock = Clock()
    sessions = SessionStore(lifetime=1000, idle=60, clock=clock)
    token = await sessions.create("key1", "")
    clock.advance(59)
    assert await sessions.get(token) is not None
    clock.advance(60)
    assert await sessions.get(token) is None


async def test_sign_out_and_revocation_end_sessions_at_once() -> None:
    sessions = SessionStore()
    mine, other = await sessions.create("key1", ""), await sessions.create("key1", "")
    theirs = await sessions.create("key2", "")
    await sessions.drop(mine)
    assert await sessions.get(mine) is None
    await sessions.drop_owner("key1")
    assert await sessions.get(other) is None
    assert await sessions.get(theirs) is not None


async def test_unknown_and_missing_ids_find_nothing() -> None:
    sessions = SessionStore()
    await sessions.create("key1", "")
    assert await sessions.get(None) is None
    assert await sessions.get("") is None
    assert await sessions.get("not-a-session") is None


async def test_the_oldest_sign_in_gives_way_past_the_cap() -> None:
    sessions = SessionStore(max_sessions=2)
    oldest, middle, newest = [await sessions.create(f"key{n}", "") for n in range(3)]
    assert await sessions.get(oldest) is None
    assert await sessions.get(middle) is not None
    assert await sessions.get(newest) is not None
    assert len(sessions) == 2


def test_nonsense_limits_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="lifetime"):
        SessionStore(idle=0)
