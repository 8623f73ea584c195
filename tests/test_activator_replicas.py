"""Two activators as two replicas over one store and one runtime, with notices between them lost: a replica
whose cache is stale must still act on the stored truth, never on its memory."""

from __future__ import annotations

import msgspec
import pytest

from activator import (
    Activator,
    ActivatorSettings,
    Lifecycle,
    SandboxNotFound,
    SandboxRecord,
    SandboxState,
    SoloCoordinator,
    Store,
)
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
    assert record.id not in b.live  # B never saw it: it can only find it in the store
    assert (await b.lookup("owner", record.id)).id == record.id
    runtime.listening.add(8000)
    (await b.open_upstream(record.id, 8000)).close()
    assert b.live[record.id].state is SandboxState.RUNNING
    assert ("restore", record.id) not in runtime.calls  # found running: nothing to wake


async def test_traffic_on_a_stale_replica_wakes_what_another_scaled_to_zero(
    store: Store, runtime: FakeRuntime, clock: Clock
) -> None:
    a, b = replica(store, runtime, clock), replica(store, runtime, clock)
    runtime.listening.add(8000)
    record = await a.create("owner", request(lifecycle=Lifecycle(on_timeout="pause", auto_resume=True)))
    (await b.open_upstream(record.id, 8000)).close()  # B has it cached as running
    await a.pause("owner", record.id)  # snapshotted by A; B never hears of it
    assert b.live[record.id].state is SandboxState.RUNNING
    stored = await store.get(record.id)
    assert stored is not None
    assert stored.state is not SandboxState.RUNNING  # the stored truth differs from B's cache
    assert ("restore", record.id) not in runtime.calls

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

    with pytest.raises(SandboxNotFound, match="doesn't exist"):
        await b.pause("owner", record.id)  # re-read under the lock: killed, not paused a second time
    assert record.id not in b.live
    assert ("snapshot", record.id) not in runtime.calls
    stored = await store.get(record.id)
    assert stored is None or stored.state is SandboxState.KILLED  # still killed, not turned into a pause


async def test_requests_for_an_unknown_sandbox_do_not_each_read_the_store(
    store: Store, runtime: FakeRuntime, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = replica(store, runtime, clock)
    reads: list[str] = []
    real_get = store.get

    async def counted(sandbox_id: str) -> SandboxRecord | None:
        reads.append(sandbox_id)
        return await real_get(sandbox_id)

    monkeypatch.setattr(store, "get", counted)
    for _ in range(50):
        with pytest.raises(SandboxNotFound):
            await b.open_upstream("nosuchsandbox", 8000)
    assert reads == ["nosuchsandbox"]  # one read; the other 49 were answered from memory
