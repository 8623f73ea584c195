"""The SQLite store and the listings built on it: filters, order, pages, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest

from activator import Activator, InvalidRequest, SandboxState, Store
from tests import test_activator_fakes as fakes
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request

pytestmark = pytest.mark.anyio


store, clock = fakes.store, fakes.clock  # the shared fixtures, bound by name for pytest


@pytest.fixture
def act(store: Store, clock: Clock) -> Activator:
    return activator(store, FakeRuntime(), clock)


async def create_many(act: Activator, clock: Clock, count: int, **metadata: str) -> list[str]:
    ids = []
    for _ in range(count):
        clock.advance(1)
        ids.append((await act.create("alice", request(metadata=metadata))).id)
    return ids


async def test_records_survive_reopening_the_database(tmp_path: Path, clock: Clock) -> None:
    store = await Store.open(tmp_path / "state.sqlite")
    record = await activator(store, FakeRuntime(), clock).create("alice", request(metadata={"k": "v"}))
    await store.close()
    reopened = await Store.open(tmp_path / "state.sqlite")
    assert await reopened.live() == [record]
    await reopened.close()


async def test_pages_follow_each_other_without_gaps(act: Activator, clock: Clock) -> None:
    ids = await create_many(act, clock, 5)
    seen, token = [], None
    while True:
        page = await act.list("alice", limit=2, next_token=token)
        seen += [record.id for record in page.records]
        if page.next_token is None:
            break
        token = page.next_token
    assert seen == ids[::-1]


async def test_an_exact_last_page_has_no_next_token(act: Activator, clock: Clock) -> None:
    await create_many(act, clock, 2)
    assert (await act.list("alice", limit=2)).next_token is None


async def test_ascending_order_lists_the_oldest_first(act: Activator, clock: Clock) -> None:
    ids = await create_many(act, clock, 3)
    assert [r.id for r in (await act.list("alice", order="asc")).records] == ids


async def test_metadata_filter_matches_all_given_pairs(act: Activator, clock: Clock) -> None:
    both = await create_many(act, clock, 3, team="a", env="prod")
    await create_many(act, clock, 3, team="a", env="dev")
    page = await act.list("alice", metadata={"team": "a", "env": "prod"}, limit=2)
    rest = await act.list("alice", metadata={"team": "a", "env": "prod"}, limit=2, next_token=page.next_token)
    assert [r.id for r in page.records + rest.records] == both[::-1]
    assert rest.next_token is None


async def test_state_template_and_start_filters(act: Activator, clock: Clock) -> None:
    old, new = await create_many(act, clock, 2)
    await act.pause("alice", new)
    assert [r.id for r in (await act.list("alice", states={SandboxState.PAUSED})).records] == [new]
    assert [r.id for r in (await act.list("alice", started_after=clock.now)).records] == [new]
    assert (await act.list("alice", template="other")).records == []
    assert len((await act.list("alice", template="base")).records) == 2
    assert [r.id for r in (await act.list("alice", states=set())).records] == []
    assert old


async def test_a_foreign_token_or_limit_is_refused(act: Activator) -> None:
    with pytest.raises(InvalidRequest):
        await act.list("alice", next_token="page2")
    with pytest.raises(InvalidRequest):
        await act.list("alice", limit=101)


async def test_killed_sandboxes_are_not_listed(act: Activator, clock: Clock) -> None:
    [sandbox_id] = await create_many(act, clock, 1)
    await act.kill("alice", sandbox_id)
    assert (await act.list("alice")).records == []
