"""The Kubernetes state store: Secrets in the gateway's namespace, shared by every gateway replica (no database).

    sandbox-<id>-record   one per sandbox: the SandboxRecord's msgspec JSON, labelled with what listings select on
                          (its id, owner: the API key's id, never a key; state; template), annotated when created.
    agent-sandbox-keys    key id -> JSON {digest, name, created_at, limits, revoked_at} (SHA-256 digests only,
                          never a key; a revoked key stays, with the time it was revoked).
    idempotency-<digest>  one per claimed Idempotency-Key (`_kube_ledger`, which this store hands those calls).

Their names, label and annotation keys, types and data keys are pool's (`pool.kube_shapes`, where the runtime's
objects are laid out too), so the two never disagree.

Secrets, not ConfigMaps: records hold the caller's env vars and envd's access token.

Records are written whole. `put` creates the Secret, or replaces it under the last resourceVersion this store saw
and, on a conflict, reads the current version and replaces again: the last writer wins. That is enough because
the activator serializes the transitions of a sandbox under its lock (shared across replicas by the
coordinator), so two writers of one record do not overlap. Key changes are read-modify-writes of the keys Secret
under its resourceVersion, retried on conflict, so concurrent ones never lose each other.

A record Secret owns nothing: the sandbox's ReplicaSet is the runtime's own object, and deleting a record (the
reaper's purge, or by hand) does not delete it. The activator kills through the runtime first, then records it.

`key_id` runs on every API request (and `key` on every create and UI request), so it answers from an in-memory
copy of the keys, read again once older than `KEYS_FRESH` seconds (an unknown digest forces a read, at most every
`KEYS_MISS_REREAD` seconds). A key revoked through another replica stops verifying here within `KEYS_FRESH`
seconds; through this store, at once.

Limits: a Secret holds at most 1 MiB, so a record over that (metadata and env vars near the E2B API's 1 MiB body
cap) is refused with `InvalidRequest`; the keys Secret fits some 5,000 keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import re
import time
from collections.abc import Callable, Collection
from typing import Literal

import msgspec

from activator._errors import ActivatorError, InvalidRequest
from activator._idempotency import ClaimedKey
from activator._kube_ledger import KubeKeyLedger, delete_secret, read_secret
from activator._kube_ledger import store_errors as _store_errors
from activator._records import ApiKey, KeyLimits, SandboxRecord, SandboxState
from activator._store import Cursor
from pool import KubeApi, KubeApiError
from pool import kube_shapes as shapes

__all__ = ["KEYS_FRESH", "KEYS_MISS_REREAD", "MAX_RECORD_BYTES", "KubeStore"]

MAX_RECORD_BYTES = 1 << 20  # the apiserver refuses a Secret whose data is larger
KEYS_FRESH = 1.0  # seconds an in-memory copy of the keys answers `key_id`
KEYS_MISS_REREAD = 0.2  # an unknown digest reads the keys again at most this often
_WRITE_ATTEMPTS = 10  # conflicts in a row before a write gives up
_VERSIONS_KEPT = 4096  # resourceVersions remembered for `put`; an older one costs a read
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_log = logging.getLogger("activator")


class _StoredKey(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the keys Secret (schema evolution as in `_records`: new fields get defaults)."""

    digest: str
    name: str
    created_at: float
    limits: KeyLimits = KeyLimits()
    revoked_at: float | None = None

    def listing(self, key_id: str) -> ApiKey:
        return ApiKey(id=key_id, name=self.name, created_at=self.created_at, limits=self.limits,
                      revoked_at=self.revoked_at)  # fmt: skip


_encode = msgspec.json.Encoder().encode
_decode_record = msgspec.json.Decoder(SandboxRecord).decode
_decode_key = msgspec.json.Decoder(_StoredKey).decode
_decode_secret = msgspec.json.Decoder(shapes.Secret).decode
_decode_list = msgspec.json.Decoder(shapes.SecretList).decode


class KubeStore:
    """Sandbox records and API keys as Secrets in one namespace; see the module docstring for the layout."""

    def __init__(self, api: KubeApi, namespace: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api  # the caller's: `close` leaves it open
        self._path = f"/api/v1/namespaces/{namespace}/secrets"
        self._clock = clock
        self._versions: dict[str, str] = {}  # sandbox id -> resourceVersion last seen, oldest first
        # The keys as last read (id -> entry), and digest -> id of the unrevoked ones; replaced whole under
        # `_keys_lock`.
        self._keys: dict[str, _StoredKey] = {}
        self._digests: dict[str, str] = {}
        self._keys_read_at = -math.inf  # `clock` time the read behind `_digests` was sent
        self._keys_lock = asyncio.Lock()  # one keys read or write at a time; waiters reuse a fresh result
        self._ledger = KubeKeyLedger(api, namespace, clock=clock)

    @classmethod
    async def open(cls, api: KubeApi, namespace: str, *, clock: Callable[[], float] = time.monotonic) -> KubeStore:
        """A store in `namespace`, checked by reading the keys once (an unreachable apiserver fails here)."""
        store = cls(api, namespace, clock=clock)
        await store.keys()
        return store

    async def close(self) -> None:
        """Nothing to release: the API client belongs to the caller."""

    async def put(self, record: SandboxRecord) -> None:
        """Create or replace the record's Secret (last writer wins, see the module docstring)."""
        secret = _record_secret(record)
        version = self._versions.get(record.id)
        with _store_errors(f"store sandbox {record.id}"):
            for _ in range(_WRITE_ATTEMPTS):
                try:
                    written = await self._write(secret, version)
                except KubeApiError as exc:
                    if exc.status != 409 and (exc.status != 404 or not version):
                        raise
                    version = await self._version_of(secret.metadata.name)
                    continue
                self._remember(record.id, written)
                return
        raise ActivatorError(f"the state store could not store sandbox {record.id}: it kept changing underneath")

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        """The record in any state, or None."""
        with _store_errors(f"read sandbox {sandbox_id}"):
            secret = await self._read(shapes.record_secret_name(sandbox_id))
            if secret is None:
                return None
            self._remember(sandbox_id, secret)
            return _record_of(secret)

    async def live(self) -> list[SandboxRecord]:
        """Every record that is not killed."""
        found = await self._list(f"{shapes.RECORD_SELECTOR},{shapes.STATE_LABEL}!={SandboxState.KILLED}")
        for record, secret in found:
            self._remember(record.id, secret)
        return [record for record, _ in found]

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
        """As `Store.page`: the owner's records are listed by label and ordered, filtered and cut here."""
        if count < 1 or not states:
            return []
        owned = f"{shapes.OWNER_LABEL}={_label_value(owner)}"
        selector = f"{shapes.RECORD_SELECTOR},{owned},{shapes.STATE_LABEL} in ({','.join(sorted(states))})"
        records = [r for r, _ in await self._list(selector) if r.owner == owner and r.state in states]
        records.sort(key=lambda r: (r.created_at, r.id), reverse=order == "desc")
        if after is not None:
            records = [r for r in records if _beyond((r.created_at, r.id), after, order)]
        return list(itertools.islice(filter(keep, records), count))

    async def purge_killed(self, before: float) -> int:
        """Delete the records of sandboxes killed before `before`, unless rewritten meanwhile; how many went."""
        purged = 0
        killed = f"{shapes.RECORD_SELECTOR},{shapes.STATE_LABEL}={SandboxState.KILLED}"
        for record, secret in await self._list(killed):
            if record.end_at < before and await self._delete(secret):
                self._versions.pop(record.id, None)
                purged += 1
        return purged

    async def add_key(self, key: ApiKey, digest: str) -> None:
        """Add a key to the keys Secret; a digest already there is kept as it is."""

        def add(keys: dict[str, _StoredKey]) -> bool:
            if any(stored.digest == digest for stored in keys.values()):
                return False
            keys[key.id] = _StoredKey(
                digest=digest, name=key.name, created_at=key.created_at, limits=key.limits, revoked_at=key.revoked_at
            )
            return True

        await self._change_keys(add)

    async def keys(self) -> list[ApiKey]:
        """Every API key, revoked ones included, oldest first (read from the apiserver)."""
        async with self._keys_lock:
            keys = await self._read_keys()
        return sorted((k.listing(key_id) for key_id, k in keys.items()), key=lambda k: (k.created_at, k.id))

    async def key(self, key_id: str) -> ApiKey | None:
        """The key with this id, from memory while fresh (see the module docstring)."""
        await self._refresh_keys(stale=lambda: self._clock() - self._keys_read_at >= KEYS_FRESH)
        stored = self._keys.get(key_id)
        return None if stored is None else stored.listing(key_id)

    async def key_id(self, digest: str) -> str | None:
        """The id of the unrevoked key with this digest, from memory while fresh (see the module docstring)."""
        await self._refresh_keys(stale=lambda: self._keys_stale(digest))
        return self._digests.get(digest)

    async def update_key(self, key: ApiKey) -> bool:
        """Replace a key's name, limits and revocation in the keys Secret (and in this store's memory at once)."""

        def update(keys: dict[str, _StoredKey]) -> bool:
            stored = keys.get(key.id)
            if stored is None:
                return False
            revoked_at = stored.revoked_at or key.revoked_at  # one way, as in SQLite
            keys[key.id] = msgspec.structs.replace(stored, name=key.name, limits=key.limits, revoked_at=revoked_at)
            return True

        return await self._change_keys(update)

    async def _refresh_keys(self, stale: Callable[[], bool]) -> None:
        if stale():
            async with self._keys_lock:
                if stale():  # not refreshed by the read this call waited for
                    await self._read_keys()

    def _keys_stale(self, digest: str) -> bool:
        age = self._clock() - self._keys_read_at
        return age >= KEYS_FRESH or (digest not in self._digests and age >= KEYS_MISS_REREAD)

    async def claim_key(self, claim: ClaimedKey, *, expired_before: float) -> ClaimedKey | None:
        """As `KeyLedger.claim_key` (a Secret per key, see `_kube_ledger`)."""
        return await self._ledger.claim_key(claim, expired_before=expired_before)

    async def settle_key(self, claim: ClaimedKey) -> None:
        """As `KeyLedger.settle_key`."""
        await self._ledger.settle_key(claim)

    async def release_key(self, owner: str, key: str) -> None:
        """As `KeyLedger.release_key`."""
        await self._ledger.release_key(owner, key)

    async def _read_keys(self) -> dict[str, _StoredKey]:
        """Read the keys Secret into memory (under `_keys_lock`)."""
        sent_at = self._clock()
        secret = await self._keys_secret()
        keys = _keys_of(secret)
        self._cache_keys(keys, sent_at)
        return keys

    async def _change_keys(self, change: Callable[[dict[str, _StoredKey]], bool]) -> bool:
        """Read-modify-write of the keys Secret, again on a conflict; False (and no write) if `change` is."""
        async with self._keys_lock:
            for _ in range(_WRITE_ATTEMPTS):
                changed = await self._try_change_keys(change)
                if changed is not None:
                    return changed
        raise ActivatorError("the state store could not update the API keys: they kept changing underneath")

    async def _try_change_keys(self, change: Callable[[dict[str, _StoredKey]], bool]) -> bool | None:
        """One read-modify-write: whether `change` changed anything, or None when another writer came first."""
        sent_at = self._clock()
        current = await self._keys_secret()
        keys = _keys_of(current)
        changed = change(keys)
        if changed:
            version = current.metadata.resource_version if current else None
            with _store_errors("update the API keys"):
                try:
                    await self._write(_keys_secret(keys), version)
                except KubeApiError as exc:
                    if exc.status == 409 or (exc.status == 404 and version):
                        return None
                    raise
        self._cache_keys(keys, sent_at)
        return changed

    def _cache_keys(self, keys: dict[str, _StoredKey], read_at: float) -> None:
        self._keys = keys
        self._digests = {stored.digest: key_id for key_id, stored in keys.items() if stored.revoked_at is None}
        self._keys_read_at = read_at

    async def _keys_secret(self) -> shapes.Secret | None:
        with _store_errors("read the API keys"):
            return await self._read(shapes.KEYS_SECRET)

    async def _read(self, name: str) -> shapes.Secret | None:
        """The Secret named `name`, or None if there is none."""
        return await read_secret(self._api, self._path, name)

    async def _write(self, secret: shapes.Secret, version: str | None) -> shapes.Secret:
        """Create `secret` (no `version`) or replace it under `version`; the stored object."""
        if not version:
            return _decode_secret(await self._api.call("POST", self._path, body=secret))
        body = msgspec.structs.replace(
            secret, metadata=msgspec.structs.replace(secret.metadata, resource_version=version)
        )
        return _decode_secret(await self._api.call("PUT", f"{self._path}/{secret.metadata.name}", body=body))

    async def _version_of(self, name: str) -> str | None:
        secret = await self._read(name)
        return None if secret is None else secret.metadata.resource_version

    async def _list(self, selector: str) -> list[tuple[SandboxRecord, shapes.Secret]]:
        """The records selected (quorum reads: a record just written is listed); unreadable ones are skipped."""
        with _store_errors("list sandboxes"):
            listed = _decode_list(await self._api.call("GET", self._path, params={"labelSelector": selector}))
        found = []
        for secret in listed.items:
            try:
                found.append((_record_of(secret), secret))
            except ActivatorError as exc:
                _log.warning("skipping Secret %s: %s", secret.metadata.name, exc)
        return found

    async def _delete(self, secret: shapes.Secret) -> bool:
        """Delete a record Secret if it is still the version listed; False if it changed or went meanwhile."""
        with _store_errors(f"delete {secret.metadata.name}"):
            return await delete_secret(self._api, self._path, secret)

    def _remember(self, sandbox_id: str, secret: shapes.Secret) -> None:
        self._versions.pop(sandbox_id, None)
        self._versions[sandbox_id] = secret.metadata.resource_version
        if len(self._versions) > _VERSIONS_KEPT:
            del self._versions[next(iter(self._versions))]


def _record_secret(record: SandboxRecord) -> shapes.Secret:
    blob = _encode(record)
    if len(blob) > MAX_RECORD_BYTES:
        raise InvalidRequest(
            f"the sandbox's record would take {len(blob)} bytes, over the {MAX_RECORD_BYTES}-byte limit of a "
            "Kubernetes Secret: send less metadata or smaller envVars"
        )
    labels = {
        shapes.ROLE_LABEL: shapes.RECORD_ROLE,
        shapes.ID_LABEL: _label_value(record.id),
        shapes.OWNER_LABEL: _label_value(record.owner),
        shapes.STATE_LABEL: record.state.value,
        shapes.TEMPLATE_LABEL: _label_value(record.template),
    }
    meta = shapes.SecretMeta(
        name=shapes.record_secret_name(record.id),
        labels=labels,
        annotations={shapes.CREATED_ANNOTATION: repr(record.created_at)},
    )
    return shapes.Secret(metadata=meta, type=shapes.RECORD_TYPE, data={shapes.RECORD_DATA: blob})


def _keys_secret(keys: dict[str, _StoredKey]) -> shapes.Secret:
    data = {key_id: _encode(stored) for key_id, stored in keys.items()}
    return shapes.Secret(metadata=shapes.SecretMeta(name=shapes.KEYS_SECRET), type=shapes.KEYS_TYPE, data=data)


def _record_of(secret: shapes.Secret) -> SandboxRecord:
    blob = secret.data.get(shapes.RECORD_DATA)
    if blob is None:
        raise ActivatorError(f"the state store's Secret {secret.metadata.name} holds no record")
    with _store_errors(f"read {secret.metadata.name}"):
        return _decode_record(blob)


def _keys_of(secret: shapes.Secret | None) -> dict[str, _StoredKey]:
    if secret is None:
        return {}
    with _store_errors(f"read {shapes.KEYS_SECRET}"):
        return {key_id: _decode_key(blob) for key_id, blob in secret.data.items()}


def _beyond(position: Cursor, after: Cursor, order: Literal["asc", "desc"]) -> bool:
    return position > after if order == "asc" else position < after


def _label_value(value: str) -> str:
    """`value` if Kubernetes takes it as a label value, else a stable digest of it (callers re-check the record)."""
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    return "sha256-" + hashlib.sha256(value.encode()).hexdigest()[:56]
