"""Two activators as two replicas over one store and one runtime, with notices between them lost: a replica
whose cache is stale must still act on the stored truth, never on its memory."""

from __future__ import annotations

import msgspec
import pytest

from activator import Activator, ActivatorSettings, Lifecycle, SandboxState, SoloCoordinator, Store
from tests import test_activator_fakes as fakes
from tests.test_activator_fakes import Clock, FakeRuntime, request, template

pytestmark = pytest.mark.anyio

store, runtime, clock = fakes.store, fakes.runtime, fakes.clock


class DeafCoordinator(SoloCoordinator):
    """Says other replicas exist but delivers none of their notices (as if every message were lost)."""

    shared = True


def replica(store: Store, runtime: FakeRuntime, clock: Clock) -> Activator:
    settings = msgspec.convert({}, ActivatorSettings)
    return Activator(store, runtime, {"base": template()}, settings, clock=clock, coordinator=DeafCoordinator())


async def test_a_replica_finds_a_sandbox_created_on_another(store: Store, runtime: FakeRuntime, clock: Clock) -> None:
    a, b = replica(store, runtime, clock), replica(store, runtime, clock)
    record = await a.create("owner", request())
    assert (await b.lookup("owner", record.id)).id == record.id
    runtime.listening.add(8000)
    (await b.open_upstream(record.id, 8000)).close()


async def test_traffic_on_a_stale_replica_wakes_what_another_scaled_to_zero(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    a, b = replica(store, runtime, clock), replica(store, runtime, clock)
    runtime.listening.add(8000)
    record = await a.create("owner", request(lifecycle=Lifecycle(on_timeout="pause", auto_resume=True)))
    (await b.open_upstream(record.id, 8000)).close()  # B has it cached as running
    await a.pause("owner", record.id)  # snapshotted by A; B never hears of it
    assert b.live[record.id].state is SandboxState.RUNNING

    (await b.open_upstream(record.id, 8000)).close()  # the socket fails: B reads the record again, wakes it

    assert b.live[record.id].state is SandboxState.RUNNING
    assert runtime.calls.count(("restore", record.id)) == 1
    assert (await store.get(record.id)) == b.live[record.id]


async def test_a_transition_on_a_stale_replica_starts_from_the_stored_record(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    a, b = replica(store, runtime, clock), replica(store, runtime, clock)
    record = await a.create("owner", request())
    await b.lookup("owner", record.id)
    await a.kill("owner", record.id)
    assert record.id in b.live  # stale

    with pytest.raises(Exception, match="doesn't exist"):
        await b.pause("owner", record.id)  # re-read under the lock: killed, not paused a second time
    assert record.id not in b.live
    assert ("snapshot", record.id) not in runtime.calls
