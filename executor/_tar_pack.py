"""Packing a directory into a tar.gz, for `GET /agent-sandbox/archive`.

Member names are relative to the directory, which is itself the member "."; a directory comes before
what it holds. Symbolic links are stored as links and never followed, hard links inside the directory
stay hard links, modes, owners (numbers and names), mtimes and `user.*` xattrs (`_tar_xattrs`) are kept.
Left out: sockets and device nodes (whoever made them makes them again at run time), and whatever is on
another filesystem (a mount point is kept as an empty directory, like `tar --one-file-system`, so that a
directory of "/" does not descend into /proc). A file that changes while it is read is cut or zero-padded
to the size its header announced, and one that vanishes is left out.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from typing import BinaryIO

from executor._errors import PayloadTooLarge
from executor._tar_xattrs import add_xattrs

__all__ = ("pack",)

COMPRESS_LEVEL = 1
"""Fast: a pause waits for this, and the typical workdir (sources, a venv) compresses well anyway."""
_VANISHED = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


def pack(root: str, out: BinaryIO, limit: int) -> int:
    """Write `root` to `out` as a tar.gz and return its size; PayloadTooLarge past `limit` bytes."""
    sink = _Limited(out, limit)
    with tarfile.open(fileobj=sink, mode="w:gz", compresslevel=COMPRESS_LEVEL) as tar:
        tar.add(root, arcname=".", recursive=False)
        device = os.lstat(root).st_dev
        pending = [(root, "")]
        while pending:
            directory, prefix = pending.pop()
            below: list[tuple[str, str]] = []
            for entry in _entries(directory):
                status = _add(tar, entry.path, prefix + entry.name)
                if status is not None and stat.S_ISDIR(status.st_mode) and status.st_dev == device:
                    below.append((entry.path, f"{prefix}{entry.name}/"))
            pending.extend(reversed(below))  # depth first, in name order
    return sink.written


def _entries(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except OSError as exc:
        if exc.errno in _VANISHED:
            return []
        raise


def _add(tar: tarfile.TarFile, path: str, name: str) -> os.stat_result | None:
    """Add one entry (not what a directory holds) and return its lstat; None when it was left out."""
    try:
        status = os.lstat(path)
        if not stat.S_ISREG(status.st_mode):
            info = tar.gettarinfo(path, name)
            if info is None or info.ischr() or info.isblk():  # None: a socket
                return None
            if info.isdir():
                add_xattrs(info, path)
            tar.addfile(info)
            return status
        # Opened before its header is made, without following a link swapped in meanwhile.
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as file:
            info = tar.gettarinfo(arcname=name, fileobj=file)
            add_xattrs(info, file.fileno())
            tar.addfile(info, _Exactly(file, info.size) if info.isreg() else None)
            return status
    except OSError as exc:
        if exc.errno in _VANISHED:
            return None
        raise


class _Exactly(io.RawIOBase):
    """Exactly `size` bytes of a file that may be growing or shrinking: cut, or padded with zeros."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file = file
        self._left = size

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data = self._file.read(size)
        self._left -= size
        return data + bytes(size - len(data))


class _Limited(io.RawIOBase):
    """Passes writes on to `out` and counts them; PayloadTooLarge once they pass `limit`."""

    def __init__(self, out: BinaryIO, limit: int) -> None:
        self._out = out
        self._limit = limit
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self.written += len(data)
        if self.written > self._limit:
            raise PayloadTooLarge(f"the archive is larger than the limit of {self._limit} bytes")
        return self._out.write(data)
