"""The sandboxes of a namespace as their ReplicaSets say, whoever created them: one list + watch.

The cluster is the source of truth, so that several gateway replicas (and one restarted) agree on every
sandbox. A sandbox is
- running: its ReplicaSet wants a pod (replicas ≥ 1), is not being deleted, and carries no snapshot record;
- snapshotted: its ReplicaSet carries a snapshot record (`ArchiveRecord`): scaled to zero, or being scaled
  back up by a restore that has not finished (a restore cut short is started over);
- unknown otherwise (no ReplicaSet, one being deleted, or one scaled to zero by someone else: no record,
  its files are gone).
"""

from __future__ import annotations

import msgspec

from pool._kube._api import KubeApi
from pool._kube._archive import ArchiveRecord
from pool._kube._manifest import ReplicaSet, ReplicaSetList
from pool._kube._shapes import ROLE_SELECTOR
from pool._kube._watch import ObjectWatch

__all__ = ["ReplicaSetWatch", "is_running", "is_snapshotted"]


def is_running(replica_set: ReplicaSet) -> bool:
    wanted = replica_set.spec.replicas >= 1 and not replica_set.deleting
    return wanted and ArchiveRecord.of(replica_set) is None


def is_snapshotted(replica_set: ReplicaSet) -> bool:
    return not replica_set.deleting and ArchiveRecord.of(replica_set) is not None


class ReplicaSetWatch(ObjectWatch[ReplicaSet]):
    """The sandbox ReplicaSets of one namespace, kept current; `start` returns once the first list is in."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        super().__init__(
            api,
            f"/apis/apps/v1/namespaces/{namespace}/replicasets",
            ROLE_SELECTOR,
            item=msgspec.json.Decoder(ReplicaSet),
            listing=msgspec.json.Decoder(ReplicaSetList),
        )

    def get(self, sandbox_id: str) -> ReplicaSet | None:
        """The sandbox's ReplicaSet as last seen, or None."""
        return next(iter(self.of(sandbox_id).values()), None)

    def running(self, sandbox_id: str) -> bool:
        found = self.get(sandbox_id)
        return found is not None and is_running(found)

    def snapshotted(self, sandbox_id: str) -> bool:
        found = self.get(sandbox_id)
        return found is not None and is_snapshotted(found)

    def ids(self, *, snapshotted: bool) -> set[str]:
        """Every running sandbox, or every snapshotted one."""
        test = is_snapshotted if snapshotted else is_running
        return {sandbox_id for sandbox_id, found in self.groups() if any(test(rs) for rs in found.values())}
