"""Directory watching for `filesystem.Filesystem`: the WatchDir stream and the polled watchers.

WatchDir sends `{"start":{}}` once the watch is in place, then one `filesystem` message per event
(keepalives in between when asked). CreateWatcher starts a watch that collects events until
GetWatcherEvents takes them; RemoveWatcher stops it. Either way, at most `MAX_PENDING` events
wait for a reader: past that the watch fails (`resource_exhausted`) rather than grow without bound.

A watch covers what the user's own inotify watch would, though the executor holds it: the directory,
which the user must be able to read, and with `recursive` every directory under it that the user may
list, found with its rights (`_fs_ops.check_directory`); a new subdirectory is watched at once, but its
events reach the client only once the user's own look (`listable_directories`, one call for all those of
one read) found it may list it (`_inotify`). Each event's entry (`include_entry`) is read with the user's
rights too (`_fs_ops.entries`, one call per batch of events), so it is None where the user may not see it.
"""

from __future__ import annotations

import asyncio
import os

from executor._as_user import AsUser
from executor._connect import Call, Rpc, ServerStream, Stream, Unary
from executor._defaults import Defaults
from executor._errors import ExecutorError, Internal, NotFound, PayloadTooLarge
from executor._fs_ops import Directory, check_directory, entries, listable_directories
from executor._inotify import FsEvent, Watcher
from executor._paths import resolve
from executor._users import User, from_authorization
from executor.envd import (
    Empty,
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

    def __init__(self, request: WatchRequest, directories: list[Directory], as_user: AsUser, user: User) -> None:
        self._as_user = as_user
        self._user = user
        self._include_entry = request.wants_entry
        self._events: list[FilesystemEvent] = []
        self._unread: list[FsEvent] = []  # with include_entry: events waiting for `_read_entries`
        self._reading: asyncio.Task[None] | None = None
        self._error: ExecutorError | None = None
        self.changed = asyncio.Event()
        expand = self._expand if request.recursive else None
        self.watcher = Watcher(directories[0], directories[1:], self._add, self._fail, expand)

    def take(self) -> list[FilesystemEvent]:
        """The events so far (and forget them); raises the error that ended the watch, if any."""
        if self._error is not None:
            raise self._error
        events, self._events = self._events, []
        self.changed.clear()
        return events

    def _add(self, events: list[FsEvent]) -> None:
        if self._include_entry:
            self._unread.extend(events)
            if self._reading is None or self._reading.done():
                self._reading = asyncio.get_running_loop().create_task(self._read_entries())
        else:
            self._events.extend(FilesystemEvent(name, kind) for name, _, kind in events)
            self.changed.set()
        if len(self._events) + len(self._unread) > MAX_PENDING:
            self._fail(f"more than {MAX_PENDING} filesystem events are waiting to be read", PayloadTooLarge)

    async def _read_entries(self) -> None:
        """Give the waiting events their entries, in order; each call to the helper takes all that came meanwhile."""
        while self._unread and self._error is None:
            batch, self._unread = self._unread, []
            paths = list(dict.fromkeys(path for _, path, _ in batch))  # a write is many events of one path
            try:
                found = await self._as_user.run(self._user, entries, paths)
                if len(found) != len(paths):
                    raise Internal(f"the file helper sent {len(found)} entries for {len(paths)} paths")
            except ExecutorError as exc:
                self._fail(f"error reading the entries of filesystem events: {exc.message}", type(exc))
                return
            entry_of = dict(zip(paths, found, strict=True))
            self._events.extend(FilesystemEvent(name, kind, entry_of[path]) for name, path, kind in batch)
            self.changed.set()

    async def _expand(self, paths: list[str]) -> list[Directory]:
        return await self._as_user.run(self._user, listable_directories, paths)

    def _fail(self, message: str, kind: type[ExecutorError] = ExecutorError) -> None:
        self._error = kind(message)
        self.watcher.close()
        self.changed.set()


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
        """A watch of what the user may read there (`_fs_ops.check_directory`, with its rights)."""
        user = from_authorization(call.headers.get("authorization"), self._defaults.user)
        path = resolve(request.path, user, self._defaults.workdir)
        directories = await self._as_user.run(user, check_directory, path, request.recursive)
        if not directories or directories[0].path != path:
            raise Internal(f"the file helper did not check '{path}'")
        return _Collected(request, directories, self._as_user, user)

    def _find(self, watcher_id: str) -> _Collected:
        if watcher_id not in self._watchers:
            raise NotFound(f"watcher with id {watcher_id} not found")
        return self._watchers[watcher_id]
