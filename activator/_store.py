"""The state store's contract: sandbox records, API-key digests and claimed Idempotency-Keys (`KeyLedger`), kept by
SQLite locally or by Kubernetes objects.

Two implementations: `SqliteStore` (one process, the data directory) and `KubeStore` (Secrets in a namespace, shared
by every gateway replica). Everything above them is typed against `Store` alone.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection
from typing import Literal, Protocol

import msgspec

from activator._errors import InvalidRequest
from activator._idempotency import KeyLedger
from activator._records import ApiKey, SandboxRecord, SandboxState

__all__ = ["Cursor", "Store", "decode_cursor", "encode_cursor"]

Cursor = tuple[float, str]  # (created_at, id): the listing order, and where the next page starts

_encode = msgspec.json.Encoder().encode
_decode_cursor = msgspec.json.Decoder(tuple[float, str]).decode


class Store(KeyLedger, Protocol):
    """Where records, API keys and Idempotency-Keys live. Failures of the backing storage raise `ActivatorError`
    (500)."""

    async def close(self) -> None:
        """Release the store's resources."""

    async def put(self, record: SandboxRecord) -> None:
        """Insert or replace a record (the caller serializes writes per sandbox)."""

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        """The stored record in any state, killed included; None if there is none."""

    async def live(self) -> list[SandboxRecord]:
        """Every record that is not killed."""

    async def page(
        self,
        owner: str,
        states: Collection[SandboxState],
        *,
        order: Literal["asc", "desc"],
        after: Cursor | None,
        count: int,
        keep: Callable[[SandboxRecord], bool],
    ) -> list[SandboxRecord]:
        """Up to `count` of `owner`'s records in `states` for which `keep` holds, ordered by (created_at, id)
        ascending or descending, starting strictly after `after`. Empty when `count` < 1 or `states` is empty.

        `keep` may run on another thread, so it must only look at the record.
        """

    async def purge_killed(self, before: float) -> int:
        """Delete the records of sandboxes killed before `before` (`end_at < before`); returns how many went."""

    async def add_key(self, key: ApiKey, digest: str) -> None:
        """Store a new API key by its digest. A digest already stored stays as it is, under its first id: the
        same raw key registered twice (two replicas bootstrapping one AGENT_SANDBOX_API_KEY) is one key."""

    async def keys(self) -> list[ApiKey]:
        """Every API key, revoked ones included, oldest first."""

    async def key(self, key_id: str) -> ApiKey | None:
        """The key with this id as stored now (revoked or not); None if there is none. Read at every create and UI
        request, so it may answer from memory for about a second, as `key_id` does."""

    async def key_id(self, digest: str) -> str | None:
        """The id of the key with this digest, if there is one and it is not revoked. Called on every API request,
        so it may answer from memory: a key revoked through another store instance stops verifying within about a
        second."""

    async def update_key(self, key: ApiKey) -> bool:
        """Replace the stored name, limits and revocation of the key `key.id` (at once for this instance's
        `key_id`); False if there is none with this id."""


def encode_cursor(record: SandboxRecord) -> str:
    """An opaque `nextToken` that continues a listing after `record`."""
    return base64.urlsafe_b64encode(_encode((record.created_at, record.id))).decode()


def decode_cursor(token: str) -> Cursor:
    """Undo `encode_cursor`; a token we did not make is an `InvalidRequest`."""
    try:
        return _decode_cursor(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidRequest(f"invalid nextToken {token!r}") from exc
