"""The network options through the Activator (real store, fake runtime): stored, handed to the runtime, refused
where the runtime cannot enforce them."""

from __future__ import annotations

import msgspec
import pytest

from activator import InvalidRequest, SandboxNotFound, SandboxRecord, Store
from activator._records import Egress, Ingress
from pool import ALL_TRAFFIC, EgressRules
from tests import test_activator_fakes as fakes
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request

pytestmark = pytest.mark.anyio

store, runtime, clock = fakes.store, fakes.runtime, fakes.clock  # the shared fixtures, bound by name for pytest

NO_INTERNET = Egress(deny_out=("0.0.0.0/0",))
REFUSAL = "this runtime cannot enforce allowOut domains"
DOMAIN = Egress(allow_out=("example.com",), deny_out=("0.0.0.0/0",))


async def test_create_hands_the_rules_to_the_runtime_and_stores_them(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    record = await activator(store, runtime, clock).create("alice", request(egress=NO_INTERNET))
    assert runtime.specs[record.id].egress == EgressRules(deny_out=ALL_TRAFFIC)
    assert (await store.get(record.id)) == record
    assert record.egress == NO_INTERNET


async def test_private_ports_get_a_traffic_token_of_their_own(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    acts = activator(store, runtime, clock)
    public = await acts.create("alice", request())
    private = await acts.create("alice", request(public_traffic=False, mask_request_host="localhost:${PORT}"))
    assert public.ingress.traffic_access_token is None
    token = private.ingress.traffic_access_token
    assert token is not None
    assert token != private.access_token
    assert await acts.ingress(private.id) == private.ingress
    assert await acts.ingress("nosuchsandbox") is None
    assert token not in str(runtime.specs[private.id].annotations)


async def test_update_network_applies_at_once_to_a_running_sandbox(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    acts = activator(store, runtime, clock)
    record = await acts.create("alice", request())
    await acts.update_network("alice", record.id, NO_INTERNET, allow_internet_access=False)
    assert runtime.egress[record.id] == EgressRules(deny_out=ALL_TRAFFIC)
    stored = await store.get(record.id)
    assert stored is not None
    assert (stored.egress, stored.allow_internet_access) == (NO_INTERNET, False)


async def test_update_network_on_a_paused_sandbox_waits_for_its_restore(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    acts = activator(store, runtime, clock)
    record = await acts.create("alice", request())
    await acts.pause("alice", record.id)
    await acts.update_network("alice", record.id, NO_INTERNET, allow_internet_access=None)
    assert record.id not in runtime.egress
    await acts.connect("alice", record.id, 60)
    assert runtime.specs[record.id].egress == EgressRules(deny_out=ALL_TRAFFIC)


async def test_update_network_of_an_unknown_or_foreign_sandbox_is_not_found(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    acts = activator(store, runtime, clock)
    record = await acts.create("alice", request())
    for owner, sandbox_id in (("alice", "nosuchsandbox"), ("bob", record.id)):
        with pytest.raises(SandboxNotFound):
            await acts.update_network(owner, sandbox_id, NO_INTERNET, allow_internet_access=None)


async def test_domains_a_runtime_cannot_enforce_are_refused_before_anything_starts(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    runtime.domain_refusal = REFUSAL
    acts = activator(store, runtime, clock)
    for egress in (DOMAIN, Egress(allow_out=("203.0.113.1", "*.example.com"), deny_out=("0.0.0.0/0",))):
        with pytest.raises(InvalidRequest, match=REFUSAL):
            await acts.create("alice", request(egress=egress))
    assert runtime.specs == {}
    record = await acts.create("alice", request(egress=Egress(allow_out=("203.0.113.1",), deny_out=("0.0.0.0/0",))))
    assert runtime.specs[record.id].egress.allow_out == ("203.0.113.1",)  # IPs and CIDRs it enforces
    with pytest.raises(InvalidRequest, match=REFUSAL):
        await acts.update_network("alice", record.id, DOMAIN, allow_internet_access=None)
    await acts.update_network("alice", record.id, NO_INTERNET, allow_internet_access=False)


def test_a_record_stored_before_the_network_options_reads_as_public_with_the_internet() -> None:
    old = b'{"id":"a1","owner":"k","template":"base","alias":"base","state":"running","created_at":1.0,' \
        b'"started_at":1.0,"end_at":2.0,"timeout":1.0,"allow_internet_access":null}'  # fmt: skip
    record = msgspec.json.decode(old, type=SandboxRecord)
    assert (record.egress, record.ingress) == (Egress(), Ingress())
    assert record.egress.rules == EgressRules()
