"""The stand-in kubelet: scheduler for its one node, and runner of the pods bound to it.

It lists and watches every pod. An unbound pod for the default scheduler is bound to this node (a Binding,
as kube-scheduler posts); a pod bound here gets a `PodWorker` (keyed by uid) that runs it. The sync loop
is the only task that reads the watch and adds to `self._workers`; a worker's task removes its own entry
when it ends (both on the event loop, so no lock); bindings run as their own small tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import msgspec

from kube_dev._context import NodeContext
from kube_dev._objects import Pod, PodList, WatchEvent
from kube_dev._pod_worker import PodWorker, finish_deletion
from pool import KubeApiError, RuntimeFailure

__all__ = ["Kubelet"]

logger = logging.getLogger("kubelet")

_pod_list = msgspec.json.Decoder(PodList)
_event = msgspec.json.Decoder(WatchEvent)
_pod = msgspec.json.Decoder(Pod)


class Kubelet:
    """Binds pending pods to the node and keeps one worker per pod bound to it."""

    def __init__(self, node: NodeContext) -> None:
        self._node = node
        self._workers: dict[str, tuple[PodWorker, asyncio.Task[None]]] = {}  # pod uid → its worker and task
        self._binding: set[str] = set()  # uids with a Binding in flight
        self._background: set[asyncio.Task[None]] = set()

    async def sync_forever(self) -> None:
        """List, then watch from the list's resourceVersion; relist whenever the watch ends or fails."""
        while True:
            try:
                await self._sync_once()
            except (RuntimeFailure, msgspec.DecodeError) as exc:
                logger.warning("pod sync: %r; relisting in 1 s", exc)
                await asyncio.sleep(1.0)

    async def shutdown(self) -> None:
        """Stop every pod's processes; the pods stay bound, to be started again by the next kubelet."""
        for worker, _ in self._workers.values():
            worker.gone()
        await asyncio.gather(*(task for _, task in self._workers.values()), return_exceptions=True)

    async def _sync_once(self) -> None:
        listing = _pod_list.decode(await self._node.client.call("GET", "/api/v1/pods"))
        listed = {pod.metadata.uid for pod in listing.items}
        for uid, (worker, _) in list(self._workers.items()):
            if uid not in listed:
                worker.gone()
        for pod in listing.items:
            self._observe(pod)
        params = {"resourceVersion": listing.metadata.resource_version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": "240"}  # fmt: skip
        async for line in self._node.client.watch("/api/v1/pods", params):
            event = _event.decode(line)
            if event.type == "ERROR":  # e.g. 410 Gone: the resourceVersion is too old; relist
                return
            if event.type in ("ADDED", "MODIFIED", "DELETED"):
                pod = _pod.decode(event.object)
                if event.type == "DELETED":
                    self._forget(pod)
                else:
                    self._observe(pod)

    def _observe(self, pod: Pod) -> None:
        uid, deleting = pod.metadata.uid, pod.metadata.deletion_timestamp is not None
        if not pod.spec.node_name:
            if not deleting and pod.spec.scheduler_name == "default-scheduler" and uid not in self._binding:
                self._spawn(self._bind(pod))
            return
        if pod.spec.node_name != self._node.layout.node_name:
            return
        if uid in self._workers:
            self._workers[uid][0].update(pod)
        elif deleting:  # never ran here (or finished): nothing to stop, just let it go
            self._spawn(finish_deletion(self._node.client, pod))
        elif pod.status.phase not in ("Succeeded", "Failed"):
            worker = PodWorker(pod, self._node)
            task = asyncio.create_task(self._run_worker(worker))
            self._workers[uid] = (worker, task)

    def _forget(self, pod: Pod) -> None:
        entry = self._workers.get(pod.metadata.uid)
        if entry is not None:
            entry[0].gone()

    async def _run_worker(self, worker: PodWorker) -> None:
        try:
            await worker.run()
        except Exception:
            logger.exception("pod %s: worker failed", worker.pod.key)
        finally:
            self._workers.pop(worker.pod.metadata.uid, None)

    async def _bind(self, pod: Pod) -> None:
        meta = pod.metadata
        self._binding.add(meta.uid)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta.name, "uid": meta.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self._node.layout.node_name}}  # fmt: skip
        try:
            await self._node.client.call(
                "POST", f"/api/v1/namespaces/{meta.namespace}/pods/{meta.name}/binding", body=body
            )
        except KubeApiError as exc:
            if exc.status not in (404, 409):
                logger.warning("pod %s: binding failed: %s", pod.key, exc)
        except RuntimeFailure as exc:
            logger.warning("pod %s: binding failed: %r", pod.key, exc)
        finally:
            self._binding.discard(meta.uid)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)  # a reference, so the task is not collected while it runs
        task.add_done_callback(self._background.discard)
