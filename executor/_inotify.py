"""Directory watching with Linux inotify, through ctypes (the sandbox has no third-party watcher).

A `Watcher` owns one inotify instance, read in the event loop. With `recursive` it also watches
every subdirectory, including ones created (or moved in) later. Kernel events map to envd's
EVENT_TYPE_* the way fsnotify maps them (one kernel event may give several types); each event is
named by its path relative to the watched directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
from collections.abc import Callable

from executor._errors import ExecutorError, os_errors

__all__ = ("FsEvent", "Watcher")

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF
EVENT_TYPES = (
    (IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"),
    (IN_ATTRIB, "EVENT_TYPE_CHMOD"),
    (IN_MODIFY, "EVENT_TYPE_WRITE"),
    (IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len
_libc = ctypes.CDLL(None, use_errno=True)

FsEvent = tuple[str, str, str]
"""(name relative to the watched directory, absolute path, EVENT_TYPE_*)."""


class Watcher:
    """Reports changes under one directory to `on_events`, and a broken watch to `on_error`."""

    def __init__(
        self,
        root: str,
        recursive: bool,
        on_events: Callable[[list[FsEvent]], None],
        on_error: Callable[[str], None],
    ) -> None:
        self._root = root
        self._recursive = recursive
        self._on_events = on_events
        self._on_error = on_error
        self._directories: dict[int, str] = {}  # watch descriptor -> directory
        self._loop = asyncio.get_running_loop()
        self._fd = _check(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "error creating inotify instance")
        try:
            if recursive:
                self._add_tree(root)
            else:
                self._add(root)
        except BaseException:
            os.close(self._fd)
            raise
        self._loop.add_reader(self._fd, self._read)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _add(self, directory: str) -> None:
        wd = _check(
            _libc.inotify_add_watch(self._fd, os.fsencode(directory), WATCH_MASK | IN_ONLYDIR),
            f"error watching '{directory}'",
        )
        self._directories[wd] = directory

    def _add_tree(self, top: str) -> None:
        self._add(top)
        for parent, subdirectories, _ in os.walk(top):
            for name in subdirectories:
                self._add(os.path.join(parent, name))

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        events: list[FsEvent] = []
        offset = 0
        while offset < len(data):
            wd, mask, _, size = _HEADER.unpack_from(data, offset)
            name = os.fsdecode(data[offset + _HEADER.size : offset + _HEADER.size + size].rstrip(b"\0"))
            offset += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                self._on_error("too many filesystem events: the inotify queue overflowed")
                return
            events.extend(self._translate(wd, mask, name))
        if events:
            self._on_events(events)

    def _translate(self, wd: int, mask: int, name: str) -> list[FsEvent]:
        directory = self._directories.get(wd)
        if directory is None:
            return []
        if mask & IN_IGNORED:
            del self._directories[wd]
            return []
        path = os.path.join(directory, name) if name else directory
        if self._recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            with contextlib.suppress(ExecutorError):  # gone again, or over the watch limit: keep the rest
                self._add_tree(path)
        relative = os.path.relpath(path, self._root)
        return [(relative, path, kind) for bits, kind in EVENT_TYPES if mask & bits]


def _check(result: int, action: str) -> int:
    if result < 0:
        number = ctypes.get_errno()
        with os_errors(action):
            raise OSError(number, os.strerror(number))
    return result
