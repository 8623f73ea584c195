"""E2B's `Idempotency-Key` on creates: the same key and body give the same sandbox and the same answer.

The SDK sends the header on `POST /v2/sandboxes` (`Sandbox.create(idempotency_key=...)`) and sends it again on
its own retries (429/502/503/504), so a create whose answer was lost makes one sandbox, not two. Per API key:

- a key not seen within `IDEMPOTENCY_TTL` (24 h) is claimed and the create runs; its 201 answer is kept;
- the same key and the same body again: that answer, replayed (201, the same sandbox);
- the same key with another body: 422 `idempotency_request_mismatch`;
- the same key while its create still runs: 409 `idempotency_in_progress`;
- the same key after a create a restart cut short (claimed, never answered): 409 `idempotency_outcome_unknown`;
- a create that fails releases its key (nothing was made), so a retry may run it again.

The body is compared by the SHA-256 of its canonical JSON (keys sorted), with the path, so v1 and v2 do not mix.
Keys are 1-255 of `[a-z0-9-]` as the SDK checks them (400 otherwise). Claims live in the state store (`KeyLedger`:
SQLite rows locally, Secrets on Kubernetes, which every replica shares and whose create is atomic), not in
memory: a restart keeps them, and expired ones are deleted as new ones are claimed.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from activator._errors import IdempotencyConflict, IdempotencyMismatch, InvalidRequest

__all__ = ["IDEMPOTENCY_TTL", "IN_FLIGHT_LIMIT", "ClaimedKey", "Idempotency", "KeyLedger"]

IDEMPOTENCY_TTL = 86_400.0  # seconds a key and its answer are kept
IN_FLIGHT_LIMIT = 900.0  # seconds past which another replica's unanswered claim counts as cut short, not running
_KEY = re.compile(r"[a-z0-9-]{1,255}")
_canonical = msgspec.json.Encoder(order="sorted").encode


class ClaimedKey(msgspec.Struct, frozen=True, kw_only=True):
    """One claimed key (stored as msgspec JSON; new fields get defaults, as in `_records`)."""

    owner: str  # the API key's id
    key: str
    fingerprint: str  # SHA-256 hex of the path and the canonical body
    claimed_by: str  # the process that runs (or ran) the create
    at: float  # unix seconds of the claim
    answer: bytes | None = None  # the 201 body, once the create succeeded


class KeyLedger(Protocol):
    """Where claims are kept (the state store); each call is atomic against every other replica's."""

    async def claim_key(self, claim: ClaimedKey, *, expired_before: float) -> ClaimedKey | None:
        """Store `claim` unless its (owner, key) holds a claim made at or after `expired_before`; that one is
        returned instead. Older claims are replaced (and may be deleted, of any key)."""

    async def settle_key(self, claim: ClaimedKey) -> None:
        """Replace the stored claim of (owner, key) by `claim`, which carries the answer."""

    async def release_key(self, owner: str, key: str) -> None:
        """Delete the claim of (owner, key), if there is one."""


class Idempotency:
    """Runs creates at most once per (API key, idempotency key), through a `KeyLedger`."""

    def __init__(self, ledger: KeyLedger, clock: Callable[[], float], *, shared: bool) -> None:
        """`shared`: other replicas use the same ledger, so another process's unanswered claim may still run."""
        self._ledger = ledger
        self._clock = clock
        self._shared = shared
        self._me = secrets.token_hex(8)  # this process: its own unanswered claims are creates running here

    async def once(
        self, owner: str, key: str, request: tuple[str, bytes], create: Callable[[], Awaitable[bytes]]
    ) -> bytes:
        """The answer of `create()` for this key: run now, or replayed; `request` is the (path, body) sent."""
        if not _KEY.fullmatch(key):
            raise InvalidRequest("Idempotency-Key must be 1-255 lowercase letters, digits and hyphens")
        now = self._clock()
        mark = fingerprint(request)
        claim = ClaimedKey(owner=owner, key=key, fingerprint=mark, claimed_by=self._me, at=now)
        found = await self._ledger.claim_key(claim, expired_before=now - IDEMPOTENCY_TTL)
        if found is not None:
            return self._replay(found, claim)
        try:
            answer = await create()
        except BaseException:
            await asyncio.shield(self._ledger.release_key(owner, key))
            raise
        await self._ledger.settle_key(msgspec.structs.replace(claim, answer=answer))
        return answer

    def _replay(self, found: ClaimedKey, claim: ClaimedKey) -> bytes:
        if found.fingerprint != claim.fingerprint:
            raise IdempotencyMismatch(
                f"Idempotency-Key {claim.key!r} was used with another request body; use a new key for a new request"
            )
        if found.answer is not None:
            return found.answer
        running = found.claimed_by == self._me or (self._shared and claim.at - found.at < IN_FLIGHT_LIMIT)
        if running:
            raise IdempotencyConflict(
                f"a create with Idempotency-Key {claim.key!r} is still in progress", "idempotency_in_progress"
            )
        raise IdempotencyConflict(
            f"a create with Idempotency-Key {claim.key!r} was cut short by a server restart: whether it made a "
            "sandbox is unknown (list your sandboxes, or create with a new key)",
            "idempotency_outcome_unknown",
        )


def fingerprint(request: tuple[str, bytes]) -> str:
    """SHA-256 hex of the path and the body as canonical JSON (a body that is no JSON: as sent)."""
    path, body = request
    try:
        canonical = _canonical(msgspec.json.decode(body))
    except msgspec.DecodeError:
        canonical = body
    return hashlib.sha256(path.encode() + b"\n" + canonical).hexdigest()
