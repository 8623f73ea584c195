"""Warm pools on Kubernetes: per template, a ReplicaSet of pods started ahead of demand and claimed by relabelling.

The same interface as `pool.WarmPools`, shared by every replica of the control plane. `run` is the leader's:
it keeps the pools' ReplicaSets and warms their new pods (`_warm_keeper`). `claim` works on every replica,
from a watch-fed cache of the pool pods by pool (`_warm_pods`): it moves the oldest warm-ready pod into a new
sandbox with one patch under the pod's resourceVersion (`_pool_manifest.adoption_patch`), so of two replicas
claiming one pod, one gets a 409 and tries the next; then it applies the caller's init. The caller's
`KubernetesRuntime.start` for the returned id creates the sandbox's ReplicaSet, which adopts the pod, and
must not bring it up again (`is_claimed_warm_pod`): its start commands ran, and its executor wants the
caller's access token now. `claim_for` is the same claim into a snapshotted sandbox's id, for
`KubernetesRuntime.restore`: the sandbox's ReplicaSet, scaled back to one a moment before, adopts the pod, and
the restore applies the init.

Refill is the ReplicaSet controller's: a claimed pod leaves the pool's selector, and the controller starts a
replacement at once, one per claimed pod. A burst of claims is a burst of pod creations, bounded only by the
controller's own rate limits and the cluster's capacity, not here; the warming that follows is a few calls
per pod from the leader. Each warm pod holds its requests (a tenth of a CPU and a quarter of its memory
limit) on a node for as long as it waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

import msgspec

from executor.envd import ENVD_PORT
from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi
from pool._kube._calls import connect
from pool._kube._core import KubeSettings
from pool._kube._pool_manifest import WarmPod, adoption_patch
from pool._kube._shapes import ID_LABEL, WARM_READY_ANNOTATION, WARM_SELECTOR
from pool._kube._warm_keeper import PoolKeeper
from pool._kube._warm_pods import PodCalls, PoolPods
from pool._runtime import ExecutorInit
from pool._templates import Template
from pool._warm import apply_claim_init
from pool._warm_state import PoolCounters, WarmPoolStats, resolve_targets

__all__ = ["KubeWarmPools"]

_log = logging.getLogger("pool.kubernetes.warm")


class KubeWarmPools:
    """Keeps `targets[template]` warm pods per template in pool ReplicaSets, and hands them out to creates."""

    def __init__(
        self,
        api: KubeApi,
        settings: KubeSettings,
        templates: Mapping[str, Template],
        *,
        new_id: Callable[[], str],
        targets: Mapping[str, int] | None = None,
        claim_timeout: float = 2.0,
        warm_timeout: float = 120.0,
        backoff: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        """`api` stays the caller's (not closed here); `settings` are the runtime's, whose `sandbox_user` warm pods
        run as too; `targets` overrides the templates' own `warm` (ValueError if invalid).

        `claim_timeout` bounds a claim's wait on the pod cache's first list and on a warm executor's init;
        `warm_timeout` bounds warming one pod (a `warming` mark twice as old is stale);
        `backoff` is the first and the longest pause of a template's warming after a failed one.
        """
        if claim_timeout <= 0 or warm_timeout <= 0 or not 0 < backoff[0] <= backoff[1]:
            raise ValueError("claim_timeout and warm_timeout must be > 0 and 0 < backoff[0] <= backoff[1]")
        resolved = resolve_targets(templates, targets or {})
        user = settings.sandbox_user
        self._api = api
        self._settings = settings
        self._new_id = new_id
        self._claim_timeout = claim_timeout
        self._rs_path = settings.replica_sets_path
        self._figures = {name: PoolCounters(target) for name, target in resolved.items()}
        self._pods = PoolPods(api, settings.namespace, self._pods_changed)
        self._calls = PodCalls(api, settings.namespace)
        self._keeper = PoolKeeper(
            api, settings, {n: msgspec.structs.replace(t, user=user) if user else t for n, t in templates.items()},
            self._figures, self._pods, on_change=self._notify, warm_timeout=warm_timeout, backoff=backoff,
        )  # fmt: skip
        # Pod name -> the resourceVersion a claim of this process last tried: skipped until it changes. Written by
        # claims, pruned by `_pods_changed` once the pod leaves the cache.
        self._tried: dict[str, str] = {}
        self._changed = asyncio.Event()  # set, then replaced, on every change of the figures (`changed`)
        self._closed = False

    async def claim(self, template: str, init: ExecutorInit) -> str | None:
        """Move the oldest warm-ready pod of `template` into a new sandbox with `init`; its id, or None at once
        when none is ready (or the cluster cannot be reached: the caller's cold start reports that)."""
        pod = await self._claim(template, "", self._settings.as_sandbox_user(init))
        return None if pod is None else pod.metadata.labels[ID_LABEL]

    async def claim_for(self, template: str, sandbox_id: str) -> str | None:
        """Move the oldest warm-ready pod of `template` into the existing sandbox `sandbox_id` (a resume from zero:
        `KubernetesRuntime.set_warm_source`), its init not applied; the pod's name, or None as `claim`."""
        pod = await self._claim(template, sandbox_id, None)
        return None if pod is None else pod.name

    def forget(self, sandbox_id: str) -> bool:
        """Always False: a warm pod has no sandbox id before its claim, and its ReplicaSet replaces it if it dies."""
        return False

    def stats(self) -> dict[str, WarmPoolStats]:
        """Per template: target, warm-ready and starting pods (all replicas'), and this process's counters."""
        now = time.monotonic()
        stats: dict[str, WarmPoolStats] = {}
        for name, figures in self._figures.items():
            pods = [p for p in self._pods.of(name).values() if p.metadata.deletion_timestamp is None]
            starting = sum(WARM_READY_ANNOTATION not in p.metadata.annotations for p in pods)
            stats[name] = figures.figures(ready=sum(p.warm_ready for p in pods), starting=starting, now=now)
        return stats

    async def changed(self) -> None:
        """Return at the next change of any pool's figures: lets tests wait without sleeping."""
        await self._changed.wait()

    async def run(self) -> None:
        """Keep every pool's ReplicaSet at its target and warm its new pods until `close()`: the leader's task."""
        await self._pods.start(None)
        await self._keeper.run()

    async def close(self) -> None:
        """Stop watching and warming (a pod left half-warmed is deleted); the pools' ReplicaSets stay."""
        self._closed = True
        await self._keeper.close()
        await self._pods.close()
        self._notify()

    async def delete_pools(self) -> None:
        """Delete every pool ReplicaSet of the namespace (uninstall, tests); the garbage collector takes their pods."""
        params = {"labelSelector": WARM_SELECTOR, "propagationPolicy": "Background"}
        await self._api.call("DELETE", self._rs_path, params=params)

    async def _claim(self, template: str, sandbox_id: str, init: ExecutorInit | None) -> WarmPod | None:
        """The claimed pod, counted as a claim or a miss of `template`'s pool."""
        figures = self._figures.get(template)
        if figures is None or self._closed:
            return None
        try:
            await self._pods.start(self._claim_timeout)
            pod = await self._claim_any(template, sandbox_id, init)
        except RuntimeFailure as exc:
            _log.warning("warm pool %s: claim failed, the caller starts cold: %s", template, exc)
            pod = None
        if pod is None:
            figures.misses += 1
        else:
            figures.claims += 1
        self._notify()
        return pod

    async def _claim_any(self, template: str, sandbox_id: str, init: ExecutorInit | None) -> WarmPod | None:
        """Try the warm pods oldest first; a new id ("" for `sandbox_id`) is drawn once there is a pod to try."""
        given = sandbox_id
        while (pod := self._oldest_warm(template)) is not None:
            self._tried[pod.name] = pod.metadata.resource_version
            sandbox_id = sandbox_id or self._new_id()
            adopted = await self._adopt(pod, sandbox_id)
            if adopted is None:
                continue  # claimed by another replica, or no longer Ready: the next one
            if init is None or await self._apply_init(adopted, init):
                return adopted
            self._figures[template].discarded += 1
            sandbox_id = given  # the deleted pod keeps its label while it goes: the next one gets an id of its own
        return None

    def _oldest_warm(self, template: str) -> WarmPod | None:
        """Oldest first: every warm pod is handed out within `target` claims of its warming."""
        pods = [p for p in self._pods.of(template).values() if p.warm_ready]
        fresh = [p for p in pods if self._tried.get(p.name) != p.metadata.resource_version]
        return min(fresh, key=lambda p: p.age_key, default=None)

    async def _adopt(self, pod: WarmPod, sandbox_id: str) -> WarmPod | None:
        """Relabel `pod` into the sandbox; None if it is gone, or claimed or changed so that it is not warm."""
        return await self._calls.patch_while(
            pod, lambda p: adoption_patch(p, sandbox_id, time.time()) if p.warm_ready else None
        )

    async def _apply_init(self, pod: WarmPod, init: ExecutorInit) -> bool:
        """Apply the claimer's init to the adopted pod's executor; a pod that fails it is deleted."""
        what = f"warm pod {pod.name}"
        return await apply_claim_init(
            lambda: connect(pod.status.pod_ip, ENVD_PORT, self._claim_timeout, what), init,
            within=self._claim_timeout, discard=lambda: self._calls.delete_quietly(pod.name), what=what, log=_log,
        )  # fmt: skip

    def _pods_changed(self) -> None:
        names = {pod.name for pod in self._pods.every()}
        self._tried = {name: version for name, version in self._tried.items() if name in names}
        self._keeper.wake()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
