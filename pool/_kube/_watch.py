"""One kind of object in a namespace (sandbox pods and ReplicaSets, pool pods), kept current by one list + watch.

Objects are grouped by one of their labels: the sandbox id, or a pool pod's pool; one without it is left out.
Only the watch task (`_run`) mutates `_objects`; everyone else reads it, and waits for changes on `_changed`
(or is called back by `on_change`), which the task notifies after each event. A watch the apiserver ends is
resumed from the last resourceVersion; an expired one (410 Gone) or a failed one starts over with a fresh list.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._manifest import KubeObject, ObjectList, WatchEvent
from pool._kube._shapes import ID_LABEL

__all__ = ["ObjectWatch"]

_log = logging.getLogger("pool.kubernetes")
_WATCH_SECONDS = "300"  # the apiserver ends each watch after this; it is resumed at once
_RETRY = (0.2, 5.0)  # first and last delay between failed list/watch attempts
_event = msgspec.json.Decoder(WatchEvent)
_bookmark = msgspec.json.Decoder(KubeObject)  # a bookmark's object has only its resourceVersion to read

T = TypeVar("T", bound=KubeObject)


class _Expired(Exception):
    """The watch's resourceVersion is too old: list again."""


class ObjectWatch(Generic[T]):
    """The objects at `path` matching `selector`, by their `group_by` label (the sandbox id) and name; `start`
    returns once the first list is in. `on_change` is called after every list and every event but a bookmark."""

    def __init__(
        self,
        api: KubeApi,
        path: str,
        selector: str,
        *,
        item: msgspec.json.Decoder[T],
        listing: msgspec.json.Decoder[ObjectList[T]],
        group_by: str = ID_LABEL,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._api = api
        self._path = path
        self._selector = selector
        self._item = item
        self._listing = listing
        self._group_by = group_by
        self._on_change = on_change
        self._objects: dict[str, dict[str, T]] = {}  # label value -> name -> object; written by `_run` only
        self._changed = asyncio.Condition()
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, within: float | None = 30.0) -> None:
        """Start watching (once) and return once the first list is in; RuntimeFailure after `within` seconds."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kubernetes watch {self._path}")
        try:
            async with asyncio.timeout(within):
                await self._synced.wait()
        except TimeoutError as exc:
            raise RuntimeFailure(f"could not list {self._path} within {within:g} s") from exc

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def of(self, group: str) -> Mapping[str, T]:
        """The objects by name whose label is `group`, such as a sandbox's (empty when there are none)."""
        return self._objects.get(group, {})

    def groups(self) -> Iterator[tuple[str, Mapping[str, T]]]:
        """Every label value with objects (such as every sandbox), and its objects by name."""
        return iter(list(self._objects.items()))

    async def wait(self, condition: Callable[[], bool], within: float, what: str) -> None:
        """Return once `condition()` holds (checked after every event); RuntimeFailure after `within` seconds."""
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
                _log.warning("the watch on %s failed (retrying in %.1f s): %s", self._path, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY[1])

    async def _list(self) -> str:
        listed = self._listing.decode(await self._api.call("GET", self._path, params={"labelSelector": self._selector}))
        objects: dict[str, dict[str, T]] = {}
        for obj in listed.items:
            if group := self._group(obj):
                objects.setdefault(group, {})[obj.metadata.name] = obj
        self._objects = objects
        self._synced.set()
        await self._notify()
        return listed.metadata.resource_version

    async def _watch(self, version: str) -> str:
        """Apply one watch stream's events; the resourceVersion to resume from."""
        params = {"labelSelector": self._selector, "resourceVersion": version, "timeoutSeconds": _WATCH_SECONDS}
        try:
            async for line in self._api.watch(self._path, params):
                event = _event.decode(line)
                if event.type == "ERROR":
                    raise _Expired  # in practice 410 Gone; anything else is answered by a fresh list too
                if event.type == "BOOKMARK":
                    version = _bookmark.decode(event.object).metadata.resource_version or version
                    continue
                obj = self._item.decode(event.object)
                version = obj.metadata.resource_version or version
                self._apply(event.type, obj)
                await self._notify()
        except KubeApiError as exc:
            if exc.status == 410:
                raise _Expired from exc
            raise
        except msgspec.DecodeError as exc:
            raise RuntimeFailure(f"the watch on {self._path} sent an event that is no such object: {exc}") from exc
        return version

    def _group(self, obj: T) -> str | None:
        return obj.metadata.labels.get(self._group_by)

    def _apply(self, kind: str, obj: T) -> None:
        group = self._group(obj)
        if not group:
            return
        objects = self._objects.setdefault(group, {})
        if kind == "DELETED":  # deleted, or out of the selector (the object as it was: still labelled)
            objects.pop(obj.metadata.name, None)
        else:
            objects[obj.metadata.name] = obj
        if not objects:
            del self._objects[group]

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
        if self._on_change is not None:
            self._on_change()
