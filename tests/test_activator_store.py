"""The store contract and the listings built on it (filters, order, pages, persistence), kept by both stores:
SQLite, and Kubernetes Secrets on the dev cluster."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

from activator import Activator, ApiKey, InvalidRequest, KeyLimits, SandboxRecord, SandboxState, SqliteStore, Store
from tests import kube_fixtures
from tests.test_activator_fakes import Clock, FakeRuntime, activator, clock, request
from tests.test_kube_store import kube_store, record

pytestmark = pytest.mark.anyio

kube, kube_namespace, clock = kube_fixtures.kube, kube_fixtures.kube_namespace, clock  # fixtures, bound for pytest

StoreOpener = Callable[[], contextlib.AbstractAsyncContextManager[Store]]


@contextlib.asynccontextmanager
async def sqlite_store(path: Path) -> AsyncIterator[Store]:
    store = await SqliteStore.open(path)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(params=["sqlite", pytest.param("kube", marks=pytest.mark.kube)])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreOpener:
    """Opens the store under test, again and again on the same data (a file, or a namespace of the dev cluster)."""
    if request.param == "sqlite":
        return lambda: sqlite_store(tmp_path / "state.sqlite")
    cluster: kube_fixtures.Kube = request.getfixturevalue("kube")
    namespace: str = request.getfixturevalue("kube_namespace")
    return lambda: kube_store(cluster.kubeconfig, namespace)


@pytest.fixture
async def store(open_store: StoreOpener) -> AsyncIterator[Store]:
    async with open_store() as store:
        yield store


@pytest.fixture
def act(store: Store, clock: Clock) -> Activator:
    return activator(store, FakeRuntime(), clock)


def _rendered(unix: float) -> datetime:
    """A time as the E2B answer renders it, and as the SDK sends it back."""
    return datetime.fromtimestamp(unix, UTC)


async def create_many(act: Activator, clock: Clock, count: int, **metadata: str) -> list[str]:
    ids = []
    for _ in range(count):
        clock.advance(1)
        ids.append((await act.create("alice", request(metadata=metadata))).id)
    return ids


async def test_records_survive_reopening_the_store(open_store: StoreOpener, clock: Clock) -> None:
    async with open_store() as store:
        created = await activator(store, FakeRuntime(), clock).create("alice", request(metadata={"k": "v"}))
    async with open_store() as reopened:
        assert await reopened.live() == [created]


async def test_get_finds_a_record_in_any_state(store: Store) -> None:
    killed = record("dead", state=SandboxState.KILLED)
    await store.put(record("live"))
    await store.put(killed)
    assert await store.get("live") == record("live")
    assert await store.get("dead") == killed
    assert await store.get("nope") is None
    assert await store.live() == [record("live")]


async def test_put_replaces_the_whole_record(store: Store) -> None:
    await store.put(record("abc", metadata={"a": "1"}))
    replaced = record("abc", state=SandboxState.PAUSED, pause_reason="api", remaining=12.5)
    await store.put(replaced)
    assert await store.get("abc") == replaced


async def test_purge_removes_only_records_killed_before_the_cutoff(store: Store) -> None:
    await store.put(record("old", state=SandboxState.KILLED, end_at=10.0))
    await store.put(record("new", state=SandboxState.KILLED, end_at=20.0))
    await store.put(record("run", end_at=5.0))
    assert await store.purge_killed(15.0) == 1
    assert await store.get("old") is None
    assert await store.get("new") is not None
    assert await store.get("run") is not None


async def test_a_digest_is_stored_once_under_its_first_id(store: Store) -> None:
    first, second = (ApiKey(id=f"{n:032x}", name=f"k{n}", created_at=float(n)) for n in (1, 2))
    await store.add_key(first, "d1")
    await store.add_key(second, "d1")
    assert await store.keys() == [first]
    assert await store.key_id("d1") == first.id


async def test_a_revoked_key_no_longer_resolves_and_stays_listed_with_its_limits(store: Store) -> None:
    key = ApiKey(id="ab" * 16, name="laptop", created_at=1.0, limits=KeyLimits(max_sandboxes=3))
    await store.add_key(key, "d1")
    assert await store.key_id("d1") == key.id
    revoked = msgspec.structs.replace(key, revoked_at=2.0)
    assert await store.update_key(revoked)
    assert await store.key_id("d1") is None
    assert await store.key(key.id) == revoked
    assert await store.keys() == [revoked]
    assert not await store.update_key(msgspec.structs.replace(key, id="cd" * 16))


async def test_keys_written_by_an_older_server_open_with_no_limits_and_unrevoked(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as old:
        old.execute("CREATE TABLE api_keys (id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, name TEXT NOT NULL, "
                    "created_at REAL NOT NULL)")  # fmt: skip
        old.execute("INSERT INTO api_keys VALUES ('k1', 'd1', 'laptop', 1.0)")
        old.commit()
    store = await SqliteStore.open(path)
    try:
        assert await store.keys() == [ApiKey(id="k1", name="laptop", created_at=1.0)]
        assert await store.key_id("d1") == "k1"
    finally:
        await store.close()


async def test_pages_follow_each_other_without_gaps(act: Activator, clock: Clock) -> None:
    ids = await create_many(act, clock, 5)
    seen, token = [], None
    while True:
        page = await act.list("alice", limit=2, next_token=token)
        seen += [r.id for r in page.records]
        if page.next_token is None:
            break
        token = page.next_token
    assert seen == ids[::-1]


async def test_records_created_in_the_same_instant_are_ordered_by_id(store: Store) -> None:
    for sandbox_id in ("bbb", "aaa", "ccc"):
        await store.put(record(sandbox_id, owner="alice"))
    act = activator(store, FakeRuntime(), Clock())
    first = await act.list("alice", limit=2, order="asc")
    rest = await act.list("alice", limit=2, order="asc", next_token=first.next_token)
    assert [r.id for r in first.records + rest.records] == ["aaa", "bbb", "ccc"]


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
    assert [r.id for r in (await act.list("alice", started_after=_rendered(clock.now))).records] == [new]
    assert (await act.list("alice", template="other")).records == []
    assert len((await act.list("alice", template="base")).records) == 2
    assert [r.id for r in (await act.list("alice", states=set())).records] == []
    assert old


async def test_started_after_its_own_rendered_start_includes_a_sandbox_started_between_microseconds(
    act: Activator, clock: Clock
) -> None:
    clock.advance(0.1234566)  # rendered rounded up to .123457: later than the stored start
    created = await act.create("alice", request())
    assert [r.id for r in (await act.list("alice", started_after=_rendered(created.started_at))).records] == [
        created.id
    ]


async def test_another_owner_sees_none_of_the_records(act: Activator, clock: Clock) -> None:
    await create_many(act, clock, 2)
    assert (await act.list("bob")).records == []


async def test_a_foreign_token_or_limit_is_refused(act: Activator) -> None:
    with pytest.raises(InvalidRequest):
        await act.list("alice", next_token="page2")
    with pytest.raises(InvalidRequest):
        await act.list("alice", limit=101)


async def test_killed_sandboxes_are_not_listed(act: Activator, clock: Clock) -> None:
    [sandbox_id] = await create_many(act, clock, 1)
    await act.kill("alice", sandbox_id)
    assert (await act.list("alice")).records == []


def test_stored_records_decode_across_versions() -> None:
    """Schema evolution: a record from before a field existed gets its default; a newer one's extra field is
    ignored (several replicas of different versions share the Kubernetes store during a rollout)."""
    stored = msgspec.json.decode(msgspec.json.encode(record("abc")), type=dict)
    older = {name: value for name, value in stored.items() if name not in ("domain", "metadata")}
    newer = stored | {"a_later_field": [1, 2]}
    for variant in (older, newer):
        assert msgspec.json.decode(msgspec.json.encode(variant), type=SandboxRecord) == record("abc")
