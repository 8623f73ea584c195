"""The pool pods of a namespace: a watch-fed cache of them, and the few calls the warm pools make on one.

`PoolPods` keeps them as `_watch.ObjectWatch` keeps sandbox objects (which it groups by sandbox id: pool pods
have none). Only its watch task (`_run`) replaces or mutates `pods`; it calls `on_change` after each change.
A watch the apiserver ends is resumed from the last resourceVersion; an expired or failed one lists again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

import msgspec

from pool._errors import PortClosed, RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._manifest import WatchEvent
from pool._kube._pool_manifest import MERGE_PATCH, WARM_SELECTOR, WarmPod, WarmPodList

__all__ = ["PodCalls", "PoolPods", "connect"]

_log = logging.getLogger("pool.kubernetes.warm")
_CONFLICT_TRIES = 3  # patches of one pod under its resourceVersion before giving up on it
_WATCH_SECONDS = "300"
_RETRY = (0.2, 5.0)  # first and last delay between failed list/watch attempts
_event = msgspec.json.Decoder(WatchEvent)
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
            await self._api.call("DELETE", f"{self._path}/{name}")
        except KubeApiError as exc:
            if exc.status != 404:
                _log.warning("could not delete pod %s: %s", name, exc)
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


async def connect(ip: str, port: int, within: float) -> socket.socket:
    """A connected, non-blocking TCP socket to `port` at a pod's IP."""
    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(within):
            await asyncio.get_running_loop().sock_connect(sock, (ip, port))
    except ConnectionRefusedError as exc:
        sock.close()
        raise PortClosed(f"nothing listens on port {port} of warm pod {ip}") from exc
    except (OSError, TimeoutError) as exc:
        sock.close()
        raise RuntimeFailure(f"cannot connect to port {port} of warm pod {ip}: {exc!r}") from exc
    return sock


class PoolPods:
    """The pool pods of one namespace by name (`pods`), kept current; `start` returns once the first list is in."""

    def __init__(self, api: KubeApi, namespace: str, on_change: Callable[[], None]) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._on_change = on_change
        self.pods: dict[str, WarmPod] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, within: float | None) -> None:
        """Start watching (once) and return once the first list is in; RuntimeFailure after `within` seconds."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kubernetes warm pod watch")
        try:
            async with asyncio.timeout(within):
                await self._synced.wait()
        except TimeoutError as exc:
            raise RuntimeFailure(f"could not list the warm pods within {within:g} s") from exc

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        delay = _RETRY[0]
        while True:
            try:
                version = await self._list()
                delay = _RETRY[0]
                while True:
                    version = await self._watch(version)
            except _Expired:
                continue
            except RuntimeFailure as exc:
                _log.warning("the warm pod watch failed (retrying in %.1f s): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY[1])

    async def _list(self) -> str:
        listed = _pod_list.decode(await self._api.call("GET", self._path, params={"labelSelector": WARM_SELECTOR}))
        self.pods = {pod.name: pod for pod in listed.items}
        self._synced.set()
        self._on_change()
        return listed.metadata.resource_version

    async def _watch(self, version: str) -> str:
        """Apply one watch stream's events; the resourceVersion to resume from."""
        params = {"labelSelector": WARM_SELECTOR, "resourceVersion": version, "timeoutSeconds": _WATCH_SECONDS}
        try:
            async for line in self._api.watch(self._path, params):
                event = _event.decode(line)
                if event.type == "ERROR":
                    raise _Expired  # in practice 410 Gone; anything else is answered by a fresh list too
                pod = _pod.decode(event.object)
                version = pod.metadata.resource_version or version
                if event.type == "BOOKMARK":
                    continue
                if event.type == "DELETED":  # deleted, or claimed: out of the selector
                    self.pods.pop(pod.name, None)
                else:
                    self.pods[pod.name] = pod
                self._on_change()
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Expired from exc
            raise
        except msgspec.DecodeError as exc:
            raise RuntimeFailure(f"the warm pod watch sent an event that is not a pod: {exc}") from exc
        return version


class _Expired(Exception):
    """The watch's resourceVersion is too old: list again."""
