"""A warm pool as Kubernetes objects: its ReplicaSet, its pods' fields, and the patches that move a pod.

One ReplicaSet `pool-<template>` per template (labels `role: warm`, `template`), selecting its pods by
`agent-sandbox.dev/pool: <template>`; their pod template is the template's sandbox pod (`_manifest`), its
security context included, without a sandbox id. A pod's way through the pool, each step one JSON merge patch:

    created by the pool's ReplicaSet         role=warm, pool=<template>
    being warmed (leader only)               + annotation warming=<unix time>   (resourceVersion precondition)
    claimable                                + annotation warm-ready="true"
    claimed                                  role=sandbox, sandbox-id, claimed-from=<template>, no pool label,
                                             no ownerReferences, + annotation claimed-at=<unix time>
                                                                                 (resourceVersion precondition)

The claim takes the pod out of the pool's selector, so the pool's ReplicaSet controller replaces it; the
sandbox's own ReplicaSet, created next by `KubernetesRuntime.start`, matches it and adopts the orphan.
`claimed-from` stays on that pod only: it tells the runtime that this pod's start commands have run and the
caller's init is applied. `claimed-at` dates an orphan whose claimer never created its ReplicaSet.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pool._kube._manifest import EgressGuard, ObjectList, Pod, replica_set
from pool._kube._shapes import (
    CLAIMED_AT_ANNOTATION,
    CLAIMED_LABEL,
    ID_LABEL,
    POOL_LABEL,
    ROLE_LABEL,
    SANDBOX_ROLE,
    TEMPLATE_LABEL,
    WARM_READY_ANNOTATION,
    WARM_ROLE,
    WARMING_ANNOTATION,
    pool_name,
)
from pool._runtime import ExecutorInit, SandboxSpec
from pool._templates import Template

__all__ = [
    "MERGE_PATCH",
    "WarmPod",
    "WarmPodList",
    "adoption_patch",
    "is_claimed_warm_pod",
    "pool_replica_set",
    "runs_claimed_warm_pod",
    "warm_ready_patch",
    "warming_patch",
]

MERGE_PATCH = "application/merge-patch+json"
_PLACEHOLDER_ID = "warm"  # never seen: the pod template's labels are replaced


def pool_replica_set(
    template: Template,
    replicas: int,
    *,
    image_prefix: str,
    executor_args: tuple[str, ...],
    service_account: str | None = None,
    guard: EgressGuard | None = None,
) -> dict[str, Any]:
    """The pool's ReplicaSet: `replicas` pods of the template's sandbox pod, labelled as the pool's."""
    spec = SandboxSpec(sandbox_id=_PLACEHOLDER_ID, template=template, init=ExecutorInit())
    pod_template = replica_set(
        spec, image_prefix=image_prefix, executor_args=executor_args, service_account=service_account, guard=guard
    )["spec"]["template"]
    pod_labels = {ROLE_LABEL: WARM_ROLE, POOL_LABEL: template.name, TEMPLATE_LABEL: template.name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": pool_name(template.name),
            "labels": {ROLE_LABEL: WARM_ROLE, TEMPLATE_LABEL: template.name},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {POOL_LABEL: template.name}},
            "template": {**pod_template, "metadata": {"labels": pod_labels}},
        },
    }


def adoption_patch(pod: WarmPod, sandbox_id: str, now: float) -> dict[str, Any]:
    """Out of the pool, into sandbox `sandbox_id` at `now` (unix time): one patch, refused (409) if the pod
    changed since `pod` was read."""
    template = pod.template
    labels = {POOL_LABEL: None, ROLE_LABEL: SANDBOX_ROLE, ID_LABEL: sandbox_id, TEMPLATE_LABEL: template}
    return {
        "metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "labels": {**labels, CLAIMED_LABEL: template},
            "annotations": {CLAIMED_AT_ANNOTATION: str(int(now))},
            "ownerReferences": None,  # the pool's ReplicaSet lets go; the sandbox's adopts the orphan
        }
    }


def warming_patch(pod: WarmPod, now: float) -> dict[str, Any]:
    """Mark the pod as being warmed since `now` (unix time); 409 if another leader got there first."""
    annotations = {WARMING_ANNOTATION: str(int(now))}
    return {"metadata": {"resourceVersion": pod.metadata.resource_version, "annotations": annotations}}


def warm_ready_patch() -> dict[str, Any]:
    return {"metadata": {"annotations": {WARM_READY_ANNOTATION: "true"}}}


def is_claimed_warm_pod(pod: Pod) -> bool:
    """True for a pod that came from a warm pool: its start commands ran and the claimer's init is applied."""
    return CLAIMED_LABEL in pod.metadata.labels


def runs_claimed_warm_pod(pods: Iterable[Pod]) -> bool:
    """Whether a Ready pod among a sandbox's pods is a claimed warm one, which `start` must not bring up again (a
    claimed pod being deleted does not count: the pod its ReplicaSet starts instead is a cold one)."""
    return any(is_claimed_warm_pod(pod) and pod.ready_ip is not None for pod in pods)


class WarmPod(Pod, frozen=True, kw_only=True):
    """The fields of a pool pod the warm pools read."""

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def template(self) -> str:
        return self.metadata.labels.get(POOL_LABEL, "")

    @property
    def age_key(self) -> tuple[str, str]:
        """Sorts oldest first."""
        return self.metadata.creation_timestamp or "", self.metadata.name

    @property
    def warm_ready(self) -> bool:
        """Warmed (start commands run, ports open) and still Ready, in the pool: claimable."""
        warmed = self.metadata.annotations.get(WARM_READY_ANNOTATION) == "true"
        return warmed and bool(self.template) and self.ready_ip is not None

    @property
    def warming_since(self) -> float | None:
        """When a leader began warming the pod (unix time), or None if none has."""
        return _time(self.metadata.annotations.get(WARMING_ANNOTATION))

    def orphaned_since(self) -> float | None:
        """When a claimed pod that no ReplicaSet has adopted yet was claimed (unix time); None for any other."""
        if CLAIMED_LABEL not in self.metadata.labels or any(o.controller for o in self.metadata.owner_references):
            return None
        return _time(self.metadata.annotations.get(CLAIMED_AT_ANNOTATION)) or 0.0


def _time(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return 0.0  # unreadable: as old as can be


WarmPodList = ObjectList[WarmPod]
