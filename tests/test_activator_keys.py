"""API keys: shape, storage as digests, verification, revocation and the bootstrap key."""

from __future__ import annotations

from pathlib import Path

import pytest

from activator import KEY_PATTERN, ApiKeys, KeyLimits, SqliteStore, Store
from tests import test_activator_fakes as fakes

pytestmark = pytest.mark.anyio


store = fakes.store  # the shared fixture, bound by name for pytest


async def test_created_keys_have_the_e2b_shape_and_verify(store: Store) -> None:
    keys = ApiKeys(store)
    key, raw = await keys.create("laptop")
    assert KEY_PATTERN.fullmatch(raw)
    assert await keys.verify(raw) == key.id
    assert [k.name for k in await keys.list_keys()] == ["laptop"]


async def test_only_a_digest_is_stored(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "keys.sqlite")
    _, raw = await ApiKeys(store).create("laptop")
    await store.close()
    database = b"".join(path.read_bytes() for path in tmp_path.glob("keys.sqlite*"))
    assert raw.encode() not in database
    assert raw[4:].encode() not in database


async def test_unknown_and_malformed_keys_do_not_verify(store: Store) -> None:
    keys = ApiKeys(store)
    await keys.create("laptop")
    assert await keys.verify("e2b_" + "0" * 32) is None
    assert await keys.verify("not-a-key") is None


async def test_revoked_keys_stop_working_at_once(store: Store) -> None:
    keys = ApiKeys(store)
    key, raw = await keys.create("laptop")
    assert await keys.verify(raw) == key.id  # now cached
    assert await keys.revoke(key.id)
    assert await keys.verify(raw) is None
    assert not await keys.revoke(key.id)


async def test_first_start_creates_one_key_and_later_starts_none(store: Store) -> None:
    keys = ApiKeys(store)
    raw = await keys.ensure_bootstrap_key(None)
    assert raw is not None
    assert await keys.verify(raw) is not None
    assert await ApiKeys(store).ensure_bootstrap_key(None) is None
    assert len(await keys.list_keys()) == 1


async def test_an_explicit_key_is_registered_once(store: Store) -> None:
    explicit = "e2b_" + "ab" * 16
    assert await ApiKeys(store).ensure_bootstrap_key(explicit) is None
    assert await ApiKeys(store).ensure_bootstrap_key(explicit) is None
    keys = ApiKeys(store)
    assert await keys.verify(explicit) is not None
    assert [k.name for k in await keys.list_keys()] == ["AGENT_SANDBOX_API_KEY"]


@pytest.mark.parametrize("bad", ["e2b_0000test", "e2b_" + "A" * 32, "sk_" + "0" * 32, "", "e2b_" + "0" * 33])
async def test_an_explicit_key_of_the_wrong_shape_is_refused(store: Store, bad: str) -> None:
    with pytest.raises(ValueError, match="32 lowercase hex"):
        await ApiKeys(store).ensure_bootstrap_key(bad)
    assert await store.keys() == []


async def test_a_revoked_key_is_kept_listed_and_cannot_be_revoked_again(store: Store) -> None:
    keys = ApiKeys(store, clock=lambda: 42.0)
    key, raw = await keys.create("laptop")
    assert await keys.active(key.id)
    assert await keys.revoke(key.id)
    assert not await keys.active(key.id)
    assert [(k.id, k.revoked_at) for k in await keys.list_keys()] == [(key.id, 42.0)]
    assert await keys.verify(raw) is None
    assert not await keys.revoke(key.id)


async def test_a_revoked_explicit_key_stays_revoked_and_no_working_key_means_a_new_one(store: Store) -> None:
    explicit = "e2b_" + "cd" * 16
    keys = ApiKeys(store)
    await keys.ensure_bootstrap_key(explicit)
    [key] = await keys.list_keys()
    await keys.revoke(key.id)
    assert await keys.ensure_bootstrap_key(explicit) is None
    assert await keys.verify(explicit) is None
    created = await keys.ensure_bootstrap_key(None)  # every key is revoked: as on a first start
    assert created is not None
    assert await keys.verify(created) is not None


async def test_updated_limits_are_stored_and_an_unknown_key_is_none(store: Store) -> None:
    keys = ApiKeys(store)
    key, _ = await keys.create("laptop", KeyLimits(max_sandboxes=2))
    updated = await keys.update(key.id, KeyLimits(max_sandboxes=5, max_vcpus=0))
    assert updated is not None
    assert (await keys.get(key.id)) == updated
    assert updated.limits == KeyLimits(max_sandboxes=5, max_vcpus=0)
    assert await keys.update("nobody", KeyLimits()) is None
