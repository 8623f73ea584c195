"""The pool pods of a namespace: a watch-fed cache of them, and the few calls the warm pools make on one.

`PoolPods` is an `_watch.ObjectWatch` that groups the pool pods by their pool (template) rather than by
sandbox id, which they have none of; its watch task calls `on_change` after each change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._calls import delete
from pool._kube._pool_manifest import MERGE_PATCH, WarmPod, WarmPodList
from pool._kube._shapes import POOL_LABEL, WARM_SELECTOR
from pool._kube._watch import ObjectWatch

__all__ = ["PodCalls", "PoolPods"]

_log = logging.getLogger("pool.kubernetes.warm")
_CONFLICT_TRIES = 3  # patches of one pod under its resourceVersion before giving up on it
_pod = msgspec.json.Decoder(WarmPod)
_pod_list = msgspec.json.Decoder(WarmPodList)


class PodCalls:
    """Read, patch, list and delete pods of one namespace, a missing pod being None (or nothing to do)."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{namespace}/pods"

    async def patch_while(self, pod: WarmPod, patch: Callable[[WarmPod], dict[str, Any] | None]) -> WarmPod | None:
        """Apply `patch(pod)`, which carries the pod's resourceVersion; after a conflict, read the pod again and
        retry while `patch` still applies to it (None: it does not). The patched pod, or None."""
        for _ in range(_CONFLICT_TRIES):
            body = patch(pod)
            if body is None:
                return None
            try:
                return await self.patch(pod.name, body)
            except KubeApiError as exc:
                if exc.status != 409:
                    raise
            fresh = await self.get(pod.name)
            if fresh is None:
                return None
            pod = fresh
        return None

    async def patch(self, name: str, body: dict[str, Any]) -> WarmPod | None:
        """The patched pod; None if it is gone."""
        return await self._pod("PATCH", name, body)

    async def get(self, name: str) -> WarmPod | None:
        return await self._pod("GET", name, None)

    async def list(self, selector: str) -> WarmPodList:
        return _pod_list.decode(await self._api.call("GET", self._path, params={"labelSelector": selector}))

    async def delete_quietly(self, name: str) -> None:
        """Delete a pod (its ReplicaSet replaces it, if it still has one); a failure is only logged."""
        try:
            await delete(self._api, f"{self._path}/{name}")
        except RuntimeFailure as exc:
            _log.warning("could not delete pod %s: %s", name, exc)

    async def _pod(self, method: str, name: str, body: dict[str, Any] | None) -> WarmPod | None:
        try:
            answer = await self._api.call(method, f"{self._path}/{name}", body=body, content_type=MERGE_PATCH)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return _pod.decode(answer)


class PoolPods(ObjectWatch[WarmPod]):
    """The pool pods of one namespace by pool (`of(template)`) and name, kept current; `start` returns once the
    first list is in."""

    def __init__(self, api: KubeApi, namespace: str, on_change: Callable[[], None]) -> None:
        super().__init__(
            api,
            f"/api/v1/namespaces/{namespace}/pods",
            WARM_SELECTOR,
            item=_pod,
            listing=_pod_list,
            group_by=POOL_LABEL,
            on_change=on_change,
        )

    def every(self) -> list[WarmPod]:
        """Every pool pod, of any pool."""
        return [pod for _, pods in self.groups() for pod in pods.values()]
