"""Which sandbox pods exist, and at which IP each Ready one answers: one list + watch over the namespace.

Only the watch task (`_run`) mutates `_pods`; everyone else reads it, and waits for changes on `_changed`,
which the task notifies after each event. A watch the apiserver ends is resumed from the last
resourceVersion; an expired one (410 Gone) or a failed one starts over with a fresh list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._manifest import ROLE_SELECTOR, Pod, PodList, WatchEvent

__all__ = ["PodWatch"]

_log = logging.getLogger("pool.kubernetes")
_WATCH_SECONDS = "300"  # the apiserver ends each watch after this; it is resumed at once
_RETRY = (0.2, 5.0)  # first and last delay between failed list/watch attempts
_event = msgspec.json.Decoder(WatchEvent)
_pod = msgspec.json.Decoder(Pod)
_pod_list = msgspec.json.Decoder(PodList)


class _Expired(Exception):
    """The watch's resourceVersion is too old: list again."""


class PodWatch:
    """The sandbox pods of one namespace, kept current; `start` returns once the first list is in."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._pods: dict[str, dict[str, Pod]] = {}  # sandbox id -> pod name -> pod; written by `_run` only
        self._changed = asyncio.Condition()
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, within: float = 30.0) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kubernetes pod watch")
        try:
            async with asyncio.timeout(within):
                await self._synced.wait()
        except TimeoutError as exc:
            raise RuntimeFailure(f"could not list the sandbox pods within {within:g} s") from exc

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def ready_ip(self, sandbox_id: str) -> str | None:
        """The IP of a Ready pod of the sandbox, or None."""
        for pod in self._pods.get(sandbox_id, {}).values():
            if (ip := pod.ready_ip) is not None:
                return ip
        return None

    def has_pods(self, sandbox_id: str) -> bool:
        return bool(self._pods.get(sandbox_id))

    async def wait_ready(self, sandbox_id: str, within: float) -> str:
        """The IP of a Ready pod of the sandbox, once there is one; RuntimeFailure after `within` seconds."""
        await self._wait(lambda: self.ready_ip(sandbox_id) is not None, within, f"sandbox {sandbox_id} to be Ready")
        ip = self.ready_ip(sandbox_id)
        assert ip is not None
        return ip

    async def wait_gone(self, sandbox_id: str, within: float) -> None:
        """Return once the sandbox has no pod left (its processes ended); RuntimeFailure after `within` seconds."""
        await self._wait(lambda: not self.has_pods(sandbox_id), within, f"the pods of sandbox {sandbox_id} to go")

    async def _wait(self, condition: Callable[[], bool], within: float, what: str) -> None:
        try:
            async with asyncio.timeout(within), self._changed:
                await self._changed.wait_for(condition)
        except TimeoutError as exc:
            raise RuntimeFailure(f"timed out after {within:g} s waiting for {what}") from exc

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
                _log.warning("the sandbox pod watch failed (retrying in %.1f s): %s", delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY[1])

    async def _list(self) -> str:
        listed = _pod_list.decode(await self._api.call("GET", self._path, params={"labelSelector": ROLE_SELECTOR}))
        pods: dict[str, dict[str, Pod]] = {}
        for pod in listed.items:
            if pod.sandbox_id:
                pods.setdefault(pod.sandbox_id, {})[pod.metadata.name] = pod
        self._pods = pods
        self._synced.set()
        await self._notify()
        return listed.metadata.resource_version

    async def _watch(self, version: str) -> str:
        """Apply one watch stream's events; the resourceVersion to resume from."""
        params = {"labelSelector": ROLE_SELECTOR, "resourceVersion": version, "timeoutSeconds": _WATCH_SECONDS}
        try:
            async for line in self._api.watch(self._path, params):
                event = _event.decode(line)
                if event.type == "ERROR":
                    raise _Expired  # in practice 410 Gone; anything else is answered by a fresh list too
                pod = _pod.decode(event.object)
                version = pod.metadata.resource_version or version
                if event.type != "BOOKMARK":
                    self._apply(event.type, pod)
                    await self._notify()
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Expired from exc
            raise
        except msgspec.DecodeError as exc:
            raise RuntimeFailure(f"the pod watch sent an event that is not a pod: {exc}") from exc
        return version

    def _apply(self, kind: str, pod: Pod) -> None:
        sandbox_id = pod.sandbox_id
        if not sandbox_id:
            return
        pods = self._pods.setdefault(sandbox_id, {})
        if kind == "DELETED":
            pods.pop(pod.metadata.name, None)
        else:
            pods[pod.metadata.name] = pod
        if not pods:
            del self._pods[sandbox_id]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
