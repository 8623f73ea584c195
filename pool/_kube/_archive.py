"""A snapshotted sandbox's files: a tar.gz of its working directory, kept in Secrets its ReplicaSet owns.

An etcd object holds at most ~1.5 MiB, so the archive is cut into chunks of `CHUNK_BYTES` (1 MiB once
base64-encoded), one Secret each: `sandbox-<id>-archive-<n>`, labelled `agent-sandbox.dev/role:
sandbox-archive` and with the sandbox's id. Each names the ReplicaSet as owner (not controller, blocking its
deletion until the garbage collector removed the chunks), so deleting the sandbox deletes its archive.
Secrets rather than ConfigMaps: a sandbox's files may well hold its user's credentials.

Which archive belongs to the snapshot is recorded on the ReplicaSet (`ArchiveRecord`, annotations written
after every chunk is in): chunk count, size and sha256, checked when the archive is read back.
"""

from __future__ import annotations

import hashlib
import math

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._calls import delete
from pool._kube._manifest import ReplicaSet
from pool._kube._shapes import (
    ARCHIVE_DATA,
    ARCHIVE_ROLE,
    ID_LABEL,
    ROLE_LABEL,
    SNAPSHOT_ANNOTATION,
    SNAPSHOT_BYTES_ANNOTATION,
    SNAPSHOT_CHUNKS_ANNOTATION,
    SNAPSHOT_SECONDS_ANNOTATION,
    SNAPSHOT_SHA256_ANNOTATION,
    Secret,
    SecretList,
    archive_secret_name,
)

__all__ = ["ARCHIVE_LIMIT", "CHUNK_BYTES", "CLEARED_RECORD", "ArchiveRecord", "ArchiveStore"]

ARCHIVE_LIMIT = 64 << 20  # compressed bytes a snapshot keeps at most (86 Secrets); a larger one is refused
CHUNK_BYTES = 768 << 10  # raw bytes per Secret: 1 MiB in base64, well under etcd's object limit
_SNAPSHOTTED = "filesystem"  # the snapshot annotation's value while the sandbox is snapshotted
_RECORD = (
    SNAPSHOT_ANNOTATION, SNAPSHOT_CHUNKS_ANNOTATION, SNAPSHOT_SHA256_ANNOTATION, SNAPSHOT_BYTES_ANNOTATION,
    SNAPSHOT_SECONDS_ANNOTATION,
)  # fmt: skip
CLEARED_RECORD: dict[str, None] = dict.fromkeys(_RECORD)  # merge patch


class ArchiveRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the ReplicaSet's annotations say about its archive (present only while it is snapshotted)."""

    chunks: int
    size: int
    sha256: str
    seconds: float  # how long the snapshot took

    @classmethod
    def of(cls, replica_set: ReplicaSet) -> ArchiveRecord | None:
        """The record on `replica_set`, or None when it has none (or a malformed one: not restorable)."""
        found = replica_set.metadata.annotations
        if found.get(SNAPSHOT_ANNOTATION) != _SNAPSHOTTED:
            return None
        try:
            return cls(
                chunks=int(found[SNAPSHOT_CHUNKS_ANNOTATION]), size=int(found[SNAPSHOT_BYTES_ANNOTATION]),
                sha256=found[SNAPSHOT_SHA256_ANNOTATION], seconds=float(found[SNAPSHOT_SECONDS_ANNOTATION]),
            )  # fmt: skip
        except (KeyError, ValueError):
            return None

    def annotations(self) -> dict[str, str]:
        return {
            SNAPSHOT_ANNOTATION: _SNAPSHOTTED, SNAPSHOT_CHUNKS_ANNOTATION: str(self.chunks),
            SNAPSHOT_BYTES_ANNOTATION: str(self.size), SNAPSHOT_SHA256_ANNOTATION: self.sha256,
            SNAPSHOT_SECONDS_ANNOTATION: f"{self.seconds:.3f}",
        }  # fmt: skip


_secret = msgspec.json.Decoder(Secret)
_secrets = msgspec.json.Decoder(SecretList)


class ArchiveStore:
    """Writes, reads and deletes the archive Secrets of a namespace's sandboxes."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{namespace}/secrets"

    async def save(self, owner: ReplicaSet, archive: bytes, *, seconds: float) -> ArchiveRecord:
        """Replace the sandbox's archive with `archive` (a leftover of an earlier snapshot goes first)."""
        sandbox_id = owner.sandbox_id or ""
        await self.delete(sandbox_id)
        chunks = max(1, math.ceil(len(archive) / CHUNK_BYTES))
        for n in range(chunks):
            body = self._secret(owner, sandbox_id, n, archive[n * CHUNK_BYTES : (n + 1) * CHUNK_BYTES])
            await self._api.call("POST", self._path, body=body)
        sha256 = hashlib.sha256(archive).hexdigest()
        return ArchiveRecord(chunks=chunks, size=len(archive), sha256=sha256, seconds=seconds)

    async def load(self, sandbox_id: str, record: ArchiveRecord) -> bytes:
        """The archive `record` describes; RuntimeFailure when a chunk is missing or it does not match."""
        archive = b"".join([await self._chunk(sandbox_id, n) for n in range(record.chunks)])
        if len(archive) != record.size or hashlib.sha256(archive).hexdigest() != record.sha256:
            raise RuntimeFailure(f"sandbox {sandbox_id}: its snapshot archive does not match its record")
        return archive

    async def _chunk(self, sandbox_id: str, n: int) -> bytes:
        try:
            raw = await self._api.call("GET", f"{self._path}/{archive_secret_name(sandbox_id, n)}")
        except KubeApiError as exc:
            if exc.status != 404:
                raise
            raise RuntimeFailure(f"sandbox {sandbox_id}: chunk {n} of its snapshot archive is gone") from exc
        return _secret.decode(raw).data.get(ARCHIVE_DATA, b"")

    async def delete(self, sandbox_id: str) -> None:
        """Delete every archive chunk of the sandbox (there may be none)."""
        selector = f"{ROLE_LABEL}={ARCHIVE_ROLE},{ID_LABEL}={sandbox_id}"
        listed = _secrets.decode(await self._api.call("GET", self._path, params={"labelSelector": selector}))
        for secret in listed.items:
            await delete(self._api, f"{self._path}/{secret.metadata.name}")

    @staticmethod
    def _secret(owner: ReplicaSet, sandbox_id: str, n: int, chunk: bytes) -> dict[str, object]:
        reference = {
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner.metadata.name, "uid": owner.metadata.uid,
            "controller": False, "blockOwnerDeletion": True,
        }  # fmt: skip
        metadata = {
            "name": archive_secret_name(sandbox_id, n),
            "labels": {ROLE_LABEL: ARCHIVE_ROLE, ID_LABEL: sandbox_id},
            "ownerReferences": [reference],
        }
        return {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata, "data": {ARCHIVE_DATA: chunk},
        }  # fmt: skip
