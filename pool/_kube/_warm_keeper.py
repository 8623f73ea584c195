"""The leader's side of the warm pools: the pool ReplicaSets, the warming of their new pods, and the cleanup.

`PoolKeeper.run` keeps each pool's ReplicaSet at its target (the ReplicaSet controller starts the pods and
replaces claimed ones) and warms each new pod once it is Ready: it marks it `warming` under its
resourceVersion (a second leader gets a 409 and stays off it), runs the template's start commands and waits
for its ports (`bring_up`, with no access token), then marks it `warm-ready`, which makes it claimable on
every replica. A pod whose warming fails is deleted (its ReplicaSet replaces it) and the template's warming
backs off. Deleted too: a pod whose `warming` mark is stale (its leader went away mid-way), and a claimed pod
no sandbox ReplicaSet adopted in time (its claimer went away before `KubernetesRuntime.start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from pool._errors import PoolError, RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._calls import connect
from pool._kube._core import KubeSettings
from pool._kube._guard_client import GuardKey
from pool._kube._pool_manifest import MERGE_PATCH, WarmPod, pool_replica_set, warm_ready_patch, warming_patch
from pool._kube._shapes import CLAIMED_LABEL, WARM_READY_ANNOTATION, pool_name
from pool._kube._warm_pods import PodCalls, PoolPods
from pool._runtime import ExecutorInit, SandboxSpec
from pool._template_start import Connect, bring_up
from pool._templates import Template
from pool._warm_state import PoolCounters

__all__ = ["PoolKeeper", "unwarmed"]

_log = logging.getLogger("pool.kubernetes.warm")
_ORPHAN_SECONDS = 120.0  # a claimed pod that no ReplicaSet adopted within this is deleted
_SWEEP_SECONDS = 30.0  # how often the keeper looks for such orphans


def unwarmed(pod: WarmPod) -> bool:
    """Ready in its pool and not warm yet (it may be being warmed)."""
    return bool(pod.template) and pod.ready_ip is not None and WARM_READY_ANNOTATION not in pod.metadata.annotations


class PoolKeeper:
    """The pool ReplicaSets and their pods' warming, for the templates of `figures`; `run` on the leader only.

    `figures` are this process's counters per template, touched on the event loop only: claims by
    `KubeWarmPools.claim`, warming and its backoff by the keeper's tasks.
    """

    def __init__(
        self,
        api: KubeApi,
        settings: KubeSettings,
        templates: Mapping[str, Template],
        figures: Mapping[str, PoolCounters],
        pods: PoolPods,
        *,
        on_change: Callable[[], None],
        warm_timeout: float,
        backoff: tuple[float, float],
    ) -> None:
        self._api = api
        self._settings = settings
        self._templates = templates  # with the runtime's user override applied
        self._figures = figures
        self._pods = pods
        self._calls = PodCalls(api, settings.namespace)
        self._on_change = on_change
        self._warm_timeout = warm_timeout
        self._backoff = backoff
        self._rs_path = settings.replica_sets_path
        self._guard_key = GuardKey(api, settings.namespace)
        # Pod name -> the task warming (or deleting a stale) pod; added by `run`, removed as the task ends.
        self._busy: dict[str, asyncio.Task[None]] = {}
        self._next_sweep = 0.0  # monotonic time of the next look for orphans; `run`'s
        self._wanted = asyncio.Event()  # set by `wake` and finished tasks; cleared and waited on only by `run`
        self._closed = False

    def wake(self) -> None:
        """Something changed that `run` may act on (the pool pods' cache calls this)."""
        self._wanted.set()

    async def run(self) -> None:
        """Set up the pools, then warm and clean up until `close()`."""
        await self._ensure_pools()
        while not self._closed:
            self._wanted.clear()
            self._warm_new_pods()
            if time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + _SWEEP_SECONDS
                await self._sweep_orphans()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_check_in()):
                    await self._wanted.wait()

    async def close(self) -> None:
        """Stop; a pod being warmed is deleted (nobody finishes its warming)."""
        self._closed = True
        self._wanted.set()
        busy = list(self._busy.values())
        for task in busy:
            task.cancel()
        await asyncio.gather(*busy, return_exceptions=True)

    async def _ensure_pools(self) -> None:
        """Create or update every pool's ReplicaSet, retrying while the apiserver fails."""
        delay = self._backoff[0]
        while not self._closed:
            try:
                for name, figures in self._figures.items():
                    await self._ensure_pool(self._templates[name], figures.target)
                return
            except RuntimeFailure as exc:
                _log.warning("warm pools: cannot set up the pool ReplicaSets (retrying in %.1f s): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff[1])

    async def _ensure_pool(self, template: Template, target: int) -> None:
        body = pool_replica_set(
            template, target, image_prefix=self._settings.image_prefix, executor_args=self._settings.executor_args,
            service_account=self._settings.service_account, guard=self._settings.guard,
        )  # fmt: skip
        if self._settings.guard is not None:
            await self._guard_key.get()  # the pods name its Secret: it exists before the first of them
        path = f"{self._rs_path}/{pool_name(template.name)}"
        if target == 0:  # scale an earlier pool down, if there is one (a failure is retried, as a create's is)
            try:
                await self._api.call("PATCH", path, body={"spec": {"replicas": 0}}, content_type=MERGE_PATCH)
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
            return
        try:
            await self._api.call("POST", self._rs_path, body=body)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
            # The selector is immutable (and the same). Pods started before keep their spec: only their
            # replacements get a changed template.
            spec = {key: value for key, value in body["spec"].items() if key != "selector"}
            update = {"metadata": {"labels": body["metadata"]["labels"]}, "spec": spec}
            await self._api.call("PATCH", path, body=update, content_type=MERGE_PATCH)

    def _warm_new_pods(self) -> None:
        now, wall = time.monotonic(), time.time()
        for pod in self._waiting():
            since = pod.warming_since
            if since is not None:  # another leader's, or one that went away
                if wall - since > 2 * self._warm_timeout:
                    self._spawn(pod.name, self._delete_stale(pod.name))
            elif self._figures[pod.template].retry_at <= now:
                self._spawn(pod.name, self._warm(pod, self._figures[pod.template]))

    def _waiting(self) -> list[WarmPod]:
        """Ready pods of a known pool, not warm yet, that no task of this process works on."""
        pods = [p for name in self._figures for p in self._pods.of(name).values()]
        return [p for p in pods if p.name not in self._busy and unwarmed(p)]

    def _next_check_in(self) -> float:
        """Seconds until the next orphan sweep, backoff end or stale warming mark."""
        now, wall = time.monotonic(), time.time()
        waits = [self._next_sweep - now]
        for pod in self._waiting():
            since = pod.warming_since
            retry_at = self._figures[pod.template].retry_at
            waits.append(since + 2 * self._warm_timeout - wall if since is not None else retry_at - now)
        return max(min(waits), 0.01)

    def _spawn(self, pod_name: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work, name=f"warm-pod-{pod_name}")
        self._busy[pod_name] = task
        task.add_done_callback(lambda _: self._done(pod_name))

    def _done(self, pod_name: str) -> None:
        self._busy.pop(pod_name, None)
        self._wanted.set()
        self._on_change()

    async def _warm(self, pod: WarmPod, figures: PoolCounters) -> None:
        """Mark the pod as being warmed, run the template's start commands, wait for its ports, mark it ready."""
        template = self._templates[pod.template]
        try:
            marked = await self._calls.patch_while(
                pod, lambda p: warming_patch(p, time.time()) if unwarmed(p) else None
            )
            if marked is None:
                return  # another leader's now, or no longer Ready
            async with asyncio.timeout(self._warm_timeout):
                spec = self._warm_spec(template)
                await bring_up(self._connector(marked), spec, ports_timeout=self._settings.ports_timeout)
            if await self._calls.patch(pod.name, warm_ready_patch()) is None:
                return  # deleted meanwhile
        except (PoolError, TimeoutError) as exc:
            delay = figures.failed(time.monotonic(), *self._backoff)
            _log.warning(
                "warm pool %s: warming pod %s failed (%d in a row), deleting it; next try in %.1f s: %s",
                template.name, pod.name, figures.failures_in_row, delay, exc,
            )  # fmt: skip
            await self._calls.delete_quietly(pod.name)
        except asyncio.CancelledError:  # closing: a half-warmed pod is nobody's to finish
            await asyncio.shield(self._calls.delete_quietly(pod.name))
            raise
        else:
            figures.refilled_at(time.monotonic())

    def _warm_spec(self, template: Template) -> SandboxSpec:
        """What `bring_up` needs for warming: the template's env, its user, and no access token."""
        init = ExecutorInit(env_vars=dict(template.env), default_user=template.user, default_workdir=template.workdir)
        return SandboxSpec(sandbox_id=template.name, template=template, init=self._settings.as_sandbox_user(init))

    def _connector(self, pod: WarmPod) -> Connect:
        ip, what = pod.status.pod_ip, f"warm pod {pod.name}"
        return lambda port: connect(ip, port, self._settings.connect_wait, what)

    async def _delete_stale(self, pod_name: str) -> None:
        _log.warning("warm pod %s was left half-warmed by an earlier leader: deleting it", pod_name)
        await self._calls.delete_quietly(pod_name)

    async def _sweep_orphans(self) -> None:
        """Delete claimed pods that no sandbox ReplicaSet adopted within `_ORPHAN_SECONDS` of their claim."""
        try:
            listed = await self._calls.list(CLAIMED_LABEL)
        except RuntimeFailure as exc:
            _log.warning("warm pools: cannot list the claimed pods to find orphans: %s", exc)
            return
        wall = time.time()
        for pod in listed.items:
            since = pod.orphaned_since()
            if since is not None and wall - since > _ORPHAN_SECONDS and pod.metadata.deletion_timestamp is None:
                _log.warning("claimed pod %s was never adopted by its sandbox's ReplicaSet: deleting it", pod.name)
                await self._calls.delete_quietly(pod.name)
