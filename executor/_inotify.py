"""Directory watching with Linux inotify, through ctypes (the sandbox has no third-party watcher).

A `Watcher` owns one inotify instance, read in the event loop. It watches the directories it is given
(`_fs_ops.Directory`: what its caller's check found), each only if its path still names the very directory
that was checked (same device and inode, watched through the descriptor that was compared), so a directory
swapped in after the check is not watched in its place.

With `expand` (recursive) it also watches each subdirectory created or moved in later, and those under it:
at once, as before, so that what is made in it right away is seen, but holding their events back until
`expand` (the user's own look, one call for all those of one read) says which of them the user may list;
the others' watches are removed and their events dropped. Kernel events map to envd's EVENT_TYPE_* the
way fsnotify maps them (one kernel event may give several types); each event is named by its path
relative to the watched directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import struct
from collections.abc import Awaitable, Callable

from executor._errors import ExecutorError, NotFound, os_errors
from executor._fs_ops import Directory, listable_directories

__all__ = ("Expand", "FsEvent", "Watcher")

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
Expand = Callable[[list[str]], Awaitable[list[Directory]]]
"""Which of the directories at and under some new subdirectories the user may list (`listable_directories`)."""
MAX_HELD = 10_000
"""Events at most held back for `expand`'s answer (a user can stop its own helper): past that the watch fails."""


class Watcher:
    """Reports changes under `root` (and `directories`) to `on_events`, and a broken watch to `on_error`."""

    def __init__(
        self,
        root: Directory,
        directories: list[Directory],
        on_events: Callable[[list[FsEvent]], None],
        on_error: Callable[[str, type[ExecutorError]], None],
        expand: Expand | None = None,
    ) -> None:
        self._root = root.path
        self._on_events = on_events
        self._on_error = on_error
        self._expand = expand
        self._directories: dict[int, str] = {}  # watch descriptor -> directory
        self._held: dict[int, list[FsEvent]] = {}  # watch descriptor -> its events, until `expand` answers
        # The running `_check_new`s, kept until done; `close` does not cancel them (that would kill the user's
        # helper mid-call), and one that ends after it does nothing.
        self._checking: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()
        self._fd = _check(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "error creating inotify instance")
        try:
            if self._add(root) is None:
                raise NotFound(f"error watching '{root.path}': it was replaced or removed")
            for directory in directories:
                self._add(directory)
        except BaseException:
            os.close(self._fd)
            raise
        self._loop.add_reader(self._fd, self._read)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _add(self, directory: Directory) -> int | None:
        """Watch `directory` if its path still names it: its watch descriptor, or None (gone or replaced)."""
        action = f"error watching '{directory.path}'"
        with os_errors(action):
            try:
                fd = os.open(directory.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except (FileNotFoundError, NotADirectoryError):
                return None
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != (directory.device, directory.inode):
                return None
            # through the descriptor just compared: the path may name another directory by now
            wd = _check(_libc.inotify_add_watch(self._fd, b"/proc/self/fd/%d" % fd, WATCH_MASK | IN_ONLYDIR), action)
        finally:
            os.close(fd)
        self._directories[wd] = directory.path
        return wd

    def _hold_new(self, paths: list[str]) -> None:
        """Watch the new subdirectories `paths` and those under them now, their events held until `_check_new`."""
        held: dict[int, Directory] = {}
        watched = set(self._directories)  # a directory watched already (moved within the tree) stays as it is
        for directory in listable_directories(paths):  # with the executor's own rights: all of them
            with contextlib.suppress(ExecutorError):  # gone again, or over the watch limit: keep the rest
                wd = self._add(directory)
                if wd is not None and wd not in watched:
                    self._held[wd] = []
                    held[wd] = directory
        if held:
            task = self._loop.create_task(self._check_new(paths, held))
            self._checking.add(task)
            task.add_done_callback(self._checking.discard)

    async def _check_new(self, paths: list[str], held: dict[int, Directory]) -> None:
        """Release the held events of the directories the user may list; unwatch the others, dropping theirs."""
        assert self._expand is not None
        try:
            allowed = {(directory.device, directory.inode) for directory in await self._expand(paths)}
        except ExecutorError as exc:
            self._on_error(f"error watching new subdirectories: {exc.message}", type(exc))
            return
        if self._fd < 0:
            return
        released: list[FsEvent] = []
        for wd, directory in held.items():
            events = self._held.pop(wd, None)
            if events is None:  # removed meanwhile: its events go too, as it cannot be checked any more
                continue
            if (directory.device, directory.inode) in allowed:
                released.extend(events)
            else:
                del self._directories[wd]
                _libc.inotify_rm_watch(self._fd, wd)
        if released:
            self._on_events(released)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        events: list[FsEvent] = []
        new: list[str] = []  # subdirectories created or moved in, for `expand`
        offset = 0
        while offset < len(data):
            wd, mask, _, size = _HEADER.unpack_from(data, offset)
            name = os.fsdecode(data[offset + _HEADER.size : offset + _HEADER.size + size].rstrip(b"\0"))
            offset += _HEADER.size + size
            if mask & IN_Q_OVERFLOW:
                self._on_error("too many filesystem events: the inotify queue overflowed", ExecutorError)
                return
            self._held.get(wd, events).extend(self._translate(wd, mask, name, new))
        if new:
            self._hold_new(new)
        if sum(len(waiting) for waiting in self._held.values()) > MAX_HELD:
            self._on_error(
                f"more than {MAX_HELD} filesystem events wait for the check of new subdirectories", ExecutorError
            )
            return
        if events:
            self._on_events(events)

    def _translate(self, wd: int, mask: int, name: str, new: list[str]) -> list[FsEvent]:
        directory = self._directories.get(wd)
        if directory is None:
            return []
        if mask & IN_IGNORED:
            del self._directories[wd]
            self._held.pop(wd, None)
            return []
        path = os.path.join(directory, name) if name else directory
        if self._expand is not None and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            new.append(path)
        relative = os.path.relpath(path, self._root)
        return [(relative, path, kind) for bits, kind in EVENT_TYPES if mask & bits]


def _check(result: int, action: str) -> int:
    if result < 0:
        number = ctypes.get_errno()
        with os_errors(action):
            raise OSError(number, os.strerror(number))
    return result
