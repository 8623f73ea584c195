"""The Kubernetes store against the dev cluster's apiserver: shared by replicas, laid out as documented, no secrets
in labels. (The contract both stores keep is in test_activator_store.py.)"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from activator import ApiKey, ApiKeys, InvalidRequest, KubeStore, SandboxRecord, SandboxState
from activator._kube_store import KEYS_FRESH, KEYS_MISS_REREAD
from pool import kube_shapes
from pool._kube import KubeApi, load_kubeconfig
from tests import kube_fixtures
from tests.kube_fixtures import Kube
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]


@contextlib.asynccontextmanager
async def kube_store(
    kubeconfig: Path, namespace: str, *, clock: Callable[[], float] = time.monotonic
) -> AsyncIterator[KubeStore]:
    """A `KubeStore` on `namespace` with an API client of its own, closed afterwards."""
    api = KubeApi(load_kubeconfig(kubeconfig))
    try:
        store = await KubeStore.open(api, namespace, clock=clock)
        yield store
        await store.close()
    finally:
        await api.aclose()


def record(sandbox_id: str, **changes: Any) -> SandboxRecord:
    fields: dict[str, Any] = dict(
        id=sandbox_id, owner="0123456789abcdef0123456789abcdef", template="base", alias="base",
        state=SandboxState.RUNNING, created_at=1.0, started_at=1.0, end_at=301.0, timeout=300.0,
    )  # fmt: skip
    return SandboxRecord(**(fields | changes))


def secrets(kube: Kube, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    with kube.client() as client:
        response = client.get(f"/api/v1/namespaces/{namespace}/secrets", params={"labelSelector": selector})
    items: list[dict[str, Any]] = response.raise_for_status().json()["items"]
    return items


async def test_two_stores_on_one_namespace_see_each_others_records_and_keys(kube: Kube, kube_namespace: str) -> None:
    clock = Clock(now=0.0)
    async with (
        kube_store(kube.kubeconfig, kube_namespace) as one,
        kube_store(kube.kubeconfig, kube_namespace, clock=clock) as two,
    ):
        await one.put(record("aaaa"))
        assert await two.get("aaaa") == record("aaaa")
        await two.put(record("aaaa", state=SandboxState.PAUSED, pause_reason="api"))
        await one.put(record("aaaa", state=SandboxState.SNAPSHOTTED, pause_reason="api"))  # one's version is stale
        assert await two.live() == [record("aaaa", state=SandboxState.SNAPSHOTTED, pause_reason="api")]
        key, raw = await ApiKeys(one).create("laptop")
        clock.advance(KEYS_MISS_REREAD)  # an unknown key is looked up again once this has passed
        assert await ApiKeys(two).verify(raw) == key.id
        assert await two.keys() == [key]


async def test_a_key_revoked_on_one_replica_stops_verifying_on_the_other_within_the_refresh(
    kube: Kube, kube_namespace: str
) -> None:
    clock = Clock(now=0.0)
    async with (
        kube_store(kube.kubeconfig, kube_namespace) as one,
        kube_store(kube.kubeconfig, kube_namespace, clock=clock) as two,
    ):
        key, raw = await ApiKeys(one).create("laptop")
        clock.advance(KEYS_MISS_REREAD)  # an unknown key is looked up again once this has passed
        assert await ApiKeys(two).verify(raw) == key.id
        assert await ApiKeys(one).revoke(key.id)
        assert await ApiKeys(one).verify(raw) is None  # at once on the replica that revoked it
        clock.advance(KEYS_FRESH)
        assert await ApiKeys(two).verify(raw) is None


async def test_record_secrets_carry_the_documented_labels(kube: Kube, kube_namespace: str) -> None:
    async with kube_store(kube.kubeconfig, kube_namespace) as store:
        stored = record("bbbb", state=SandboxState.PAUSED, pause_reason="idle", created_at=1700000000.25)
        await store.put(stored)
    [secret] = secrets(kube, kube_namespace, "agent-sandbox.dev/role=sandbox-record")
    assert secret["metadata"]["name"] == kube_shapes.record_secret_name("bbbb") == "sandbox-bbbb-record"
    assert secret["type"] == "agent-sandbox.dev/record"
    assert secret["metadata"]["labels"] == {
        "agent-sandbox.dev/role": "sandbox-record",
        "agent-sandbox.dev/sandbox-id": "bbbb",
        "agent-sandbox.dev/owner": stored.owner,
        "agent-sandbox.dev/state": "paused",
        "agent-sandbox.dev/template": "base",
    }
    assert float(secret["metadata"]["annotations"]["agent-sandbox.dev/created-at"]) == stored.created_at
    assert msgspec.json.decode(base64.b64decode(secret["data"]["record"]), type=SandboxRecord) == stored


async def test_no_key_or_token_appears_in_labels_or_annotations(kube: Kube, kube_namespace: str) -> None:
    async with kube_store(kube.kubeconfig, kube_namespace) as store:
        key, raw = await ApiKeys(store).create("laptop")
        act = activator(store, FakeRuntime(), Clock())
        created = await act.create(key.id, request(env_vars={"OPENAI_API_KEY": "sk-secret"}, secure=True))
    assert created.access_token
    items = secrets(kube, kube_namespace)
    visible = repr([(s["metadata"].get("labels"), s["metadata"].get("annotations")) for s in items])
    for secret_value in (raw, raw[4:], created.access_token, "sk-secret"):
        assert secret_value not in visible
    [keys] = [s for s in items if s["metadata"]["name"] == kube_shapes.KEYS_SECRET]
    assert keys["type"] == "agent-sandbox.dev/api-keys"
    stored_keys = b"".join(base64.b64decode(v) for v in keys["data"].values())
    assert raw.encode() not in stored_keys
    assert raw[4:].encode() not in stored_keys


async def test_concurrent_key_writes_from_two_replicas_lose_nothing(kube: Kube, kube_namespace: str) -> None:
    async with kube_store(kube.kubeconfig, kube_namespace) as one, kube_store(kube.kubeconfig, kube_namespace) as two:
        made = [ApiKey(id=f"{n:032x}", name=f"k{n}", created_at=float(n)) for n in range(6)]
        await asyncio.gather(*((one, two)[k.created_at % 2 == 0].add_key(k, f"digest{k.name}") for k in made))
        assert await one.keys() == made


async def test_two_replicas_bootstrapping_one_explicit_key_register_it_once(kube: Kube, kube_namespace: str) -> None:
    explicit = "e2b_" + "cd" * 16
    async with kube_store(kube.kubeconfig, kube_namespace) as one, kube_store(kube.kubeconfig, kube_namespace) as two:
        await asyncio.gather(ApiKeys(one).ensure_bootstrap_key(explicit), ApiKeys(two).ensure_bootstrap_key(explicit))
        [key] = await one.keys()
        assert await ApiKeys(two).verify(explicit) == key.id


async def test_a_record_too_large_for_a_secret_is_refused(kube: Kube, kube_namespace: str) -> None:
    async with kube_store(kube.kubeconfig, kube_namespace) as store:
        with pytest.raises(InvalidRequest, match="limit of a Kubernetes Secret"):
            await store.put(record("cccc", metadata={"big": "x" * (1 << 20)}))
        assert await store.get("cccc") is None
