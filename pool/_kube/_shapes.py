"""The shapes of agent-sandbox's Kubernetes objects, written down once: names, label and annotation keys, Secrets.

The runtime (`pool._kube`) and the activator's state store (`activator.KubeStore`) build and select the same
objects, and replicas of different versions read each other's: every key and name pattern lives here only.

    object                                 labels (selectable)                       annotations, data
    ReplicaSet `sandbox-<id>` + its pod    role=sandbox, sandbox-id, template        the caller's; snapshot-* while
                                           (a claimed warm pod: + claimed-from)      snapshotted; claimed-at (pod)
    ReplicaSet `pool-<template>`           role=warm, template
      its pods                             role=warm, pool, template                 warming, warm-ready
    NetworkPolicy `sandbox-<id>-egress`    role=sandbox-egress, sandbox-id           (owned by the ReplicaSet)
      (its pod, while the policy applies:  + egress=own)
    Secret `sandbox-<id>-archive-<n>`      role=sandbox-archive, sandbox-id          data `archive`: one chunk
    Secret `sandbox-<id>-record`           role=sandbox-record, sandbox-id, owner,   created-at; type `RECORD_TYPE`,
                                           state, template                           data `record`: the record
    Secret `agent-sandbox-keys`            (none)                                    type `KEYS_TYPE`, data: key id
                                                                                     -> its digest, name, time
    Secret `idempotency-<digest>`          role=idempotency-key                      type `IDEMPOTENCY_TYPE`, data
                                                                                     `claim`: a claimed key
    Secret `agent-sandbox-egress-guard`    role=egress-guard-key                     data `key`: the egress guards' key

Every key is under `agent-sandbox.dev/`. What each one means is documented where it is written: the sandbox's
ReplicaSet in `_manifest`, the warm pool's in `_pool_manifest`, the archive in `_archive`, the guard key in
`_guard_client`, the records and keys in `activator._kube_store`, the claimed Idempotency-Keys in
`activator._kube_ledger`.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "ALIAS_ANNOTATION",
    "ARCHIVE_DATA",
    "ARCHIVE_ROLE",
    "CLAIMED_AT_ANNOTATION",
    "CLAIMED_LABEL",
    "CLAIM_DATA",
    "CREATED_ANNOTATION",
    "EGRESS_LABEL",
    "EGRESS_ROLE",
    "GUARD_KEY_FIELD",
    "GUARD_KEY_ROLE",
    "GUARD_KEY_SECRET",
    "IDEMPOTENCY_ROLE",
    "IDEMPOTENCY_SELECTOR",
    "IDEMPOTENCY_TYPE",
    "ID_LABEL",
    "KEYS_SECRET",
    "KEYS_TYPE",
    "LIFECYCLE_ANNOTATION",
    "METADATA_ANNOTATION",
    "OWNER_ANNOTATION",
    "OWNER_LABEL",
    "OWN_EGRESS",
    "POOL_LABEL",
    "RECORD_DATA",
    "RECORD_ROLE",
    "RECORD_SELECTOR",
    "RECORD_TYPE",
    "ROLE_LABEL",
    "ROLE_SELECTOR",
    "SANDBOX_ROLE",
    "SNAPSHOT_ANNOTATION",
    "SNAPSHOT_BYTES_ANNOTATION",
    "SNAPSHOT_CHUNKS_ANNOTATION",
    "SNAPSHOT_SECONDS_ANNOTATION",
    "SNAPSHOT_SHA256_ANNOTATION",
    "STATE_LABEL",
    "TEMPLATE_LABEL",
    "WARMING_ANNOTATION",
    "WARM_READY_ANNOTATION",
    "WARM_ROLE",
    "WARM_SELECTOR",
    "Secret",
    "SecretList",
    "SecretMeta",
    "archive_secret_name",
    "egress_policy_name",
    "idempotency_secret_name",
    "pool_name",
    "record_secret_name",
    "replica_set_name",
]

_PREFIX = "agent-sandbox.dev/"

ROLE_LABEL = _PREFIX + "role"
ID_LABEL = _PREFIX + "sandbox-id"
TEMPLATE_LABEL = _PREFIX + "template"
POOL_LABEL = _PREFIX + "pool"  # a warm pod's template, while it is in the pool
CLAIMED_LABEL = _PREFIX + "claimed-from"
OWNER_LABEL = _PREFIX + "owner"  # the API key's id, never a key
STATE_LABEL = _PREFIX + "state"
# On a sandbox's pod whose egress is its own NetworkPolicy's: install.yaml's shared internet policy skips it.
EGRESS_LABEL = _PREFIX + "egress"
OWN_EGRESS = "own"

SANDBOX_ROLE = "sandbox"
WARM_ROLE = "warm"
ARCHIVE_ROLE = "sandbox-archive"
RECORD_ROLE = "sandbox-record"
EGRESS_ROLE = "sandbox-egress"
GUARD_KEY_ROLE = "egress-guard-key"
GUARD_KEY_SECRET = "agent-sandbox-egress-guard"  # its `GUARD_KEY_FIELD` is every sandbox pod's guard key
GUARD_KEY_FIELD = "key"
ROLE_SELECTOR = f"{ROLE_LABEL}={SANDBOX_ROLE}"
WARM_SELECTOR = f"{ROLE_LABEL}={WARM_ROLE}"
RECORD_SELECTOR = f"{ROLE_LABEL}={RECORD_ROLE}"
IDEMPOTENCY_ROLE = "idempotency-key"
IDEMPOTENCY_SELECTOR = f"{ROLE_LABEL}={IDEMPOTENCY_ROLE}"

CLAIMED_AT_ANNOTATION = _PREFIX + "claimed-at"
WARMING_ANNOTATION = _PREFIX + "warming"
WARM_READY_ANNOTATION = _PREFIX + "warm-ready"
CREATED_ANNOTATION = _PREFIX + "created-at"
SNAPSHOT_ANNOTATION = _PREFIX + "snapshot"
SNAPSHOT_CHUNKS_ANNOTATION = _PREFIX + "snapshot-chunks"
SNAPSHOT_SHA256_ANNOTATION = _PREFIX + "snapshot-sha256"
SNAPSHOT_BYTES_ANNOTATION = _PREFIX + "snapshot-bytes"
SNAPSHOT_SECONDS_ANNOTATION = _PREFIX + "snapshot-seconds"
# What the activator shows of a sandbox on its ReplicaSet (never its env vars or token).
OWNER_ANNOTATION = OWNER_LABEL
ALIAS_ANNOTATION = _PREFIX + "alias"
METADATA_ANNOTATION = _PREFIX + "metadata"
LIFECYCLE_ANNOTATION = _PREFIX + "lifecycle"

RECORD_TYPE = _PREFIX + "record"
KEYS_TYPE = _PREFIX + "api-keys"
KEYS_SECRET = "agent-sandbox-keys"
RECORD_DATA = "record"  # the record Secret's one data key
ARCHIVE_DATA = "archive"  # an archive Secret's one data key
IDEMPOTENCY_TYPE = _PREFIX + "idempotency-key"
CLAIM_DATA = "claim"  # an idempotency Secret's one data key


def replica_set_name(sandbox_id: str) -> str:
    return f"sandbox-{sandbox_id}"


def pool_name(template: str) -> str:
    return f"pool-{template}"


def egress_policy_name(sandbox_id: str) -> str:
    return f"sandbox-{sandbox_id}-egress"


def record_secret_name(sandbox_id: str) -> str:
    return f"sandbox-{sandbox_id}-record"


def archive_secret_name(sandbox_id: str, n: int) -> str:
    return f"sandbox-{sandbox_id}-archive-{n}"


def idempotency_secret_name(digest: str) -> str:
    """`digest`: hex of the (API key id, Idempotency-Key) pair, whose characters a name may not all take."""
    return f"idempotency-{digest}"


class SecretMeta(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """A Secret's metadata as written and read back (empty fields are not sent)."""

    name: str
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    resource_version: str = ""  # empty: not sent (a create)


class Secret(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A Secret, for those written whole (records, keys) and for reading any of them back."""

    metadata: SecretMeta
    type: str = "Opaque"
    data: dict[str, bytes] = {}  # base64 on the wire, which msgspec does for bytes
    api_version: str = "v1"
    kind: str = "Secret"


class SecretList(msgspec.Struct, frozen=True, kw_only=True):
    items: list[Secret] = []
