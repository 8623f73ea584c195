"""Directory watching for `filesystem.Filesystem`: the WatchDir stream and the polled watchers.

WatchDir sends `{"start":{}}` once the watch is in place, then one `filesystem` message per event
(keepalives in between when asked). CreateWatcher starts a watch that collects events until
GetWatcherEvents takes them; RemoveWatcher stops it. Either way, at most `MAX_PENDING` events
wait for a reader: past that the watch fails (`resource_exhausted`) rather than grow without bound.
"""

from __future__ import annotations

import asyncio
import os

from executor._as_user import AsUser
from executor._connect import Call, Rpc, ServerStream, Stream, Unary
from executor._defaults import Defaults
from executor._entries import entry_info
from executor._errors import ExecutorError, NotFound, PayloadTooLarge
from executor._fs_ops import check_directory
from executor._inotify import FsEvent, Watcher
from executor._paths import resolve
from executor._users import from_authorization
from executor.envd import (
    Empty,
    EntryInfo,
    FilesystemEvent,
    GetWatcherEventsResponse,
    WatchDirResponse,
    WatcherIdResponse,
    WatcherRequest,
    WatchRequest,
)

__all__ = ("WatchService",)

MAX_PENDING = 10_000
KEEPALIVE = WatchDirResponse(keepalive=Empty())


class _Collected:
    """Events of one watch waiting for their reader, or the error that ended the watch."""

    def __init__(self, request: WatchRequest, path: str) -> None:
        self._include_entry = request.wants_entry
        self._events: list[FilesystemEvent] = []
        self._error: ExecutorError | None = None
        self.changed = asyncio.Event()
        self.watcher = Watcher(path, request.recursive, self._add, self._fail)

    def take(self) -> list[FilesystemEvent]:
        """The events so far (and forget them); raises the error that ended the watch, if any."""
        if self._error is not None:
            raise self._error
        events, self._events = self._events, []
        self.changed.clear()
        return events

    def _add(self, events: list[FsEvent]) -> None:
        for name, path, kind in events:
            self._events.append(FilesystemEvent(name, kind, self._entry(path)))
        if len(self._events) > MAX_PENDING:
            self._fail(f"more than {MAX_PENDING} filesystem events are waiting to be read", PayloadTooLarge)
        self.changed.set()

    def _fail(self, message: str, kind: type[ExecutorError] = ExecutorError) -> None:
        self._error = kind(message)
        self.watcher.close()
        self.changed.set()

    def _entry(self, path: str) -> EntryInfo | None:
        if not self._include_entry:
            return None
        try:
            return entry_info(path)
        except NotFound:
            return None


class WatchService:
    """WatchDir, CreateWatcher, GetWatcherEvents and RemoveWatcher."""

    def __init__(self, defaults: Defaults, as_user: AsUser) -> None:
        self._defaults = defaults
        self._as_user = as_user
        self._watchers: dict[str, _Collected] = {}

    def methods(self) -> dict[str, Rpc]:
        return {
            "WatchDir": ServerStream(WatchRequest, self.watch_dir, KEEPALIVE),
            "CreateWatcher": Unary(WatchRequest, self.create_watcher),
            "GetWatcherEvents": Unary(WatcherRequest, self.get_watcher_events),
            "RemoveWatcher": Unary(WatcherRequest, self.remove_watcher),
        }

    def close(self) -> None:
        for collected in self._watchers.values():
            collected.watcher.close()
        self._watchers.clear()

    async def watch_dir(self, request: WatchRequest, call: Call, stream: Stream) -> None:
        collected = await self._watch(request, call)
        try:
            await stream.send(WatchDirResponse(start=Empty()))
            while True:
                await collected.changed.wait()
                for event in collected.take():
                    await stream.send(WatchDirResponse(filesystem=event))
        finally:
            collected.watcher.close()

    async def create_watcher(self, request: WatchRequest, call: Call) -> WatcherIdResponse:
        watcher_id = "w" + os.urandom(8).hex()
        self._watchers[watcher_id] = await self._watch(request, call)
        return WatcherIdResponse(watcher_id)

    def get_watcher_events(self, request: WatcherRequest, call: Call) -> GetWatcherEventsResponse:
        return GetWatcherEventsResponse(self._find(request.id).take())

    def remove_watcher(self, request: WatcherRequest, call: Call) -> Empty:
        self._find(request.id).watcher.close()
        del self._watchers[request.id]
        return Empty()

    async def _watch(self, request: WatchRequest, call: Call) -> _Collected:
        """A watch of a directory the user may read (`_fs_ops.check_directory`, with its rights)."""
        user = from_authorization(call.headers.get("authorization"), self._defaults.user)
        path = resolve(request.path, user, self._defaults.workdir)
        await self._as_user.run(user, check_directory, path)
        return _Collected(request, path)

    def _find(self, watcher_id: str) -> _Collected:
        if watcher_id not in self._watchers:
            raise NotFound(f"watcher with id {watcher_id} not found")
        return self._watchers[watcher_id]
