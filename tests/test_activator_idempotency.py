"""Idempotency-Keys (`activator._idempotency`) over the real stores: replay, mismatch, in progress, cut short by a
restart, release on failure, expiry, and keys per API key. SQLite here, Kubernetes Secrets on the dev cluster."""

from __future__ import annotations

import asyncio

import pytest

from activator import (
    IDEMPOTENCY_TTL,
    Idempotency,
    IdempotencyConflict,
    IdempotencyMismatch,
    InvalidRequest,
    Store,
)
from tests.test_activator_fakes import Clock, clock
from tests.test_activator_store import StoreOpener, kube, kube_namespace, open_store, store

pytestmark = pytest.mark.anyio

clock, kube, kube_namespace, open_store, store = clock, kube, kube_namespace, open_store, store  # fixtures

BODY = ("/v2/sandboxes", b'{"templateID": "base", "timeout": 60}')


class Creates:
    """A create that counts its runs and answers `answer-<n>`."""

    def __init__(self) -> None:
        self.runs = 0

    async def __call__(self) -> bytes:
        self.runs += 1
        return f"answer-{self.runs}".encode()


def ledger(store: Store, clock: Clock) -> Idempotency:
    return Idempotency(store, clock, shared=False)


async def test_the_same_key_and_body_replay_the_first_answer(store: Store, clock: Clock) -> None:
    once, create = ledger(store, clock), Creates()
    assert await once.once("alice", "k-1", BODY, create) == b"answer-1"
    same_json = ("/v2/sandboxes", b'{"timeout":60,"templateID":"base"}')  # key order and spacing do not matter
    assert await once.once("alice", "k-1", same_json, create) == b"answer-1"
    assert create.runs == 1


async def test_another_body_with_the_same_key_is_a_mismatch(store: Store, clock: Clock) -> None:
    once, create = ledger(store, clock), Creates()
    await once.once("alice", "k-1", BODY, create)
    with pytest.raises(IdempotencyMismatch) as raised:
        await once.once("alice", "k-1", ("/v2/sandboxes", b'{"templateID": "base", "timeout": 61}'), create)
    assert (raised.value.status_code, raised.value.error_code) == (422, "idempotency_request_mismatch")
    with pytest.raises(IdempotencyMismatch):
        await once.once("alice", "k-1", ("/sandboxes", BODY[1]), create)  # the other API generation
    assert create.runs == 1


class Held:
    """A create that says when it runs, and finishes only once released."""

    def __init__(self) -> None:
        self.running, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self) -> bytes:
        self.running.set()
        await self.release.wait()
        return b"made"


async def test_the_same_key_while_its_create_runs_is_in_progress(store: Store, clock: Clock) -> None:
    once, held = ledger(store, clock), Held()
    first = asyncio.create_task(once.once("alice", "k-1", BODY, held))
    await held.running.wait()
    with pytest.raises(IdempotencyConflict) as raised:
        await once.once("alice", "k-1", BODY, Creates())
    assert (raised.value.status_code, raised.value.error_code) == (409, "idempotency_in_progress")
    held.release.set()
    assert await first == b"made"
    assert await once.once("alice", "k-1", BODY, Creates()) == b"made"


async def test_a_claim_a_restart_cut_short_has_an_unknown_outcome(store: Store, clock: Clock) -> None:
    held = Held()
    cut = asyncio.create_task(ledger(store, clock).once("alice", "k-1", BODY, held))
    await held.running.wait()
    after, create = ledger(store, clock), Creates()  # the next server process, on the same store
    with pytest.raises(IdempotencyConflict) as raised:
        await after.once("alice", "k-1", BODY, create)
    assert (raised.value.error_code, create.runs) == ("idempotency_outcome_unknown", 0)
    cut.cancel()


async def test_an_answer_outlives_a_restart(open_store: StoreOpener, clock: Clock) -> None:
    async with open_store() as first:
        assert await ledger(first, clock).once("alice", "k-1", BODY, Creates()) == b"answer-1"
    async with open_store() as second:
        create = Creates()
        assert await ledger(second, clock).once("alice", "k-1", BODY, create) == b"answer-1"
        assert create.runs == 0


async def test_a_failed_create_releases_its_key(store: Store, clock: Clock) -> None:
    once = ledger(store, clock)

    async def fails() -> bytes:
        raise InvalidRequest("no such template")

    with pytest.raises(InvalidRequest):
        await once.once("alice", "k-1", BODY, fails)
    assert await once.once("alice", "k-1", BODY, Creates()) == b"answer-1"


async def test_a_key_expires_after_the_ttl(store: Store, clock: Clock) -> None:
    once, create = ledger(store, clock), Creates()
    await once.once("alice", "k-1", BODY, create)
    clock.advance(IDEMPOTENCY_TTL + 1)
    assert await once.once("alice", "k-1", ("/v2/sandboxes", b"{}"), create) == b"answer-2"


async def test_keys_are_per_api_key(store: Store, clock: Clock) -> None:
    once, create = ledger(store, clock), Creates()
    await once.once("alice", "k-1", BODY, create)
    assert await once.once("bob", "k-1", BODY, create) == b"answer-2"


@pytest.mark.parametrize("key", ["", "UPPER", "under_score", "x" * 256, "sp ace"])
async def test_a_key_outside_the_sdks_alphabet_is_refused(store: Store, clock: Clock, key: str) -> None:
    with pytest.raises(InvalidRequest, match="Idempotency-Key"):
        await ledger(store, clock).once("alice", key, BODY, Creates())
