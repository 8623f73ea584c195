"""The volume content API's file operations on a volume's filesystem, done by host root as the sandbox's ids.

Every path comes from a client and names something under the volume's root, where sandboxes write too: a
sandbox can plant symlinks (`/data/x -> /etc`) that host root must never follow out of the volume. Paths
are resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) from the root's
descriptor (an absolute symlink resolves inside the volume, `..` stops at its root), and the last component
is acted on through its parent's descriptor, never followed (lstat, unlinkat, mkdirat, renameat). Owners are
the ids as the sandboxes see them (the volume is mounted id-mapped into each: `_launcher`).

Blocking: callers run these in a worker thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from pool._errors import VolumeError

__all__ = [
    "DEFAULT_GID", "DEFAULT_UID", "MAX_LISTED", "Upload", "entry_of", "list_dir", "make_dir", "open_for_read",
    "remove", "update",
]  # fmt: skip

DEFAULT_UID = DEFAULT_GID = 1000
"""Who owns what the content API makes when the call names nobody: the sandboxes' `user`, so they may change it."""
MAX_LISTED = 10_000
"""The most entries one listing returns (a deeper or wider tree: ask for less `depth`)."""

_SYS_OPENAT2 = 437
_RESOLVE_NO_XDEV, _RESOLVE_NO_MAGICLINKS, _RESOLVE_IN_ROOT = 0x01, 0x02, 0x10
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2(root: int, path: str, flags: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV)
    fd: int = _libc.syscall(_SYS_OPENAT2, root, (path or ".").encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _parts(path: str) -> list[str]:
    """The path's components; `..` is refused: as the last component it would name the volume's parent on
    the host, acted on through a descriptor openat2 never saw."""
    if "\0" in path:
        raise VolumeError(400, "a path may not contain NUL")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise VolumeError(400, f"{path!r}: '..' is not allowed in a volume path")
    return parts


def _display(parts: list[str]) -> str:
    return "/" + "/".join(parts)


@contextlib.contextmanager
def _root(volume: Path) -> Iterator[int]:
    try:
        fd = os.open(volume, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # destroyed since the token was checked
        raise VolumeError(404, "the volume is gone") from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _directory(root: int, parts: list[str], *, flags: int = os.O_PATH) -> Iterator[int]:
    """A descriptor of the directory `parts` names under the root; 404 if there is none, 400 if not a directory."""
    try:
        fd = _openat2(root, "/".join(parts), flags | os.O_DIRECTORY)
    except OSError as exc:
        raise _refusal(exc, parts) from None
    try:
        yield fd
    finally:
        os.close(fd)


def _refusal(exc: OSError, parts: list[str]) -> VolumeError:
    name = _display(parts)
    match exc.errno:
        case errno.ENOENT:
            return VolumeError(404, f"path {name} not found")
        case errno.ENOTDIR:
            return VolumeError(400, f"a component of {name} is not a directory")
        case errno.EISDIR:
            return VolumeError(400, f"{name} is a directory")
        case errno.EEXIST | errno.ENOTEMPTY:
            return VolumeError(409, f"{name} already exists")
        case errno.ENOSPC | errno.EDQUOT:
            return VolumeError(507, "the volume is full")
        case errno.ELOOP | errno.EXDEV:
            return VolumeError(400, f"{name} leads out of the volume")
        case _:
            return VolumeError(500, f"{name}: {exc.strerror}")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _entry(parts: list[str], info: os.stat_result, target: str | None) -> dict[str, object]:
    kind = (
        "directory" if stat.S_ISDIR(info.st_mode)
        else "file" if stat.S_ISREG(info.st_mode)
        else "symlink" if stat.S_ISLNK(info.st_mode)
        else "unknown"
    )  # fmt: skip
    entry: dict[str, object] = {
        "name": parts[-1] if parts else "", "type": kind, "path": _display(parts), "size": info.st_size,
        "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid,
        "atime": _iso(info.st_atime), "mtime": _iso(info.st_mtime), "ctime": _iso(info.st_ctime),
    }  # fmt: skip
    if target is not None:
        entry["target"] = target
    return entry


def _lstat(parent: int, name: str, parts: list[str]) -> dict[str, object]:
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        target = os.readlink(name, dir_fd=parent) if stat.S_ISLNK(info.st_mode) else None
    except OSError as exc:
        raise _refusal(exc, parts) from None
    return _entry(parts, info, target)


def entry_of(volume: Path, path: str) -> dict[str, object]:
    """The entry `path` names (a symlink as itself)."""
    parts = _parts(path)
    with _root(volume) as root:
        if not parts:
            return _entry(parts, os.fstat(root), None)
        with _directory(root, parts[:-1]) as parent:
            return _lstat(parent, parts[-1], parts)


def list_dir(volume: Path, path: str, depth: int) -> list[dict[str, object]]:
    """The entries of directory `path`, and of its subdirectories down to `depth` levels (1: its own)."""
    parts = _parts(path)
    listed: list[dict[str, object]] = []
    with _root(volume) as root, _directory(root, parts, flags=os.O_RDONLY) as top:
        _walk(top, parts, depth, listed)
    return listed


def _walk(directory: int, parts: list[str], depth: int, listed: list[dict[str, object]]) -> None:
    with os.scandir(directory) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        if len(listed) >= MAX_LISTED:
            raise VolumeError(400, f"more than {MAX_LISTED} entries: list with a smaller depth")
        entry = _lstat(directory, name, [*parts, name])
        listed.append(entry)
        if depth > 1 and entry["type"] == "directory":
            try:  # a directory swapped for a symlink since the lstat is not followed
                child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except OSError as exc:
                raise _refusal(exc, [*parts, name]) from None
            try:
                _walk(child, [*parts, name], depth - 1, listed)
            finally:
                os.close(child)


def _own(parent: int, name: str, uid: int | None, gid: int | None, mode: int | None, parts: list[str]) -> None:
    try:
        os.chown(name, -1 if uid is None else uid, -1 if gid is None else gid, dir_fd=parent, follow_symlinks=False)
        if mode is not None:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:
                if not stat.S_ISLNK(os.fstat(fd).st_mode):  # a symlink's mode means nothing on Linux
                    os.chmod(f"/proc/self/fd/{fd}", mode)
            finally:
                os.close(fd)
    except OSError as exc:
        raise _refusal(exc, parts) from None


def _made_parents(root: int, parts: list[str]) -> None:
    """Make the missing directories of `parts` (the sandboxes' user's, 0755), as `mkdir -p` does."""
    for index in range(len(parts)):
        with _directory(root, parts[:index]) as parent:
            try:
                os.mkdir(parts[index], 0o755, dir_fd=parent)
            except FileExistsError:
                continue
            except OSError as exc:
                raise _refusal(exc, parts[: index + 1]) from None
            _own(parent, parts[index], DEFAULT_UID, DEFAULT_GID, None, parts[: index + 1])


def make_dir(
    volume: Path, path: str, *, uid: int | None, gid: int | None, mode: int | None, force: bool
) -> dict[str, object]:
    """Make directory `path` (with its missing parents when `force`; an existing directory is then no error, and
    keeps its owner and mode)."""
    parts = _parts(path)
    if not parts:
        raise VolumeError(409, "the volume's root already exists")
    with _root(volume) as root:
        if force:
            _made_parents(root, parts[:-1])
        with _directory(root, parts[:-1]) as parent:
            try:
                os.mkdir(parts[-1], 0o755 if mode is None else mode, dir_fd=parent)
            except FileExistsError:
                if not force or not stat.S_ISDIR(os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode):
                    raise VolumeError(409, f"{_display(parts)} already exists") from None
                return _lstat(parent, parts[-1], parts)  # as it is: its owner and mode are not this call's
            except OSError as exc:
                raise _refusal(exc, parts) from None
            _own(parent, parts[-1], _or(uid, DEFAULT_UID), _or(gid, DEFAULT_GID), mode, parts)
            return _lstat(parent, parts[-1], parts)


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def open_for_read(volume: Path, path: str) -> tuple[int, int]:
    """A descriptor of regular file `path` (symlinks followed inside the volume) and its size."""
    parts = _parts(path)
    with _root(volume) as root:
        try:
            fd = _openat2(root, "/".join(parts), os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError as exc:
            raise _refusal(exc, parts) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise VolumeError(400, f"{_display(parts)} is not a file")
    os.set_blocking(fd, True)
    return fd, info.st_size


class Upload:
    """A file being written: the bytes go to an unnamed file (O_TMPFILE) in `path`'s directory, linked in over
    `path` at `finish`, so a failed, abandoned or crashed upload leaves nothing and an old file stays whole until
    then. An existing file is replaced (the SDK: "writing to a file that already exists overwrites the file";
    `force`, its "force overwrite", changes nothing more); the directory must exist (404 otherwise)."""

    def __init__(self, volume: Path, path: str, *, uid: int | None, gid: int | None, mode: int | None):
        self._parts = _parts(path)
        if not self._parts:
            raise VolumeError(400, "the volume's root is a directory")
        self._owner = (_or(uid, DEFAULT_UID), _or(gid, DEFAULT_GID), 0o644 if mode is None else mode)
        self._fd = -1
        with _root(volume) as root, _directory(root, self._parts[:-1]) as parent:
            self._parent = os.dup(parent)
        try:
            self._fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=self._parent)
        except OSError as exc:
            os.close(self._parent)
            raise _refusal(exc, self._parts) from None

    def write(self, chunk: bytes) -> None:
        try:
            view = memoryview(chunk)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            self.abandon()
            raise _refusal(exc, self._parts) from None

    def finish(self) -> dict[str, object]:
        uid, gid, mode = self._owner
        name = self._parts[-1]
        try:
            os.fchown(self._fd, uid, gid)
            os.fchmod(self._fd, mode)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.stat(name, dir_fd=self._parent, follow_symlinks=False).st_mode):
                    raise VolumeError(400, f"{_display(self._parts)} is a directory")
            temporary = f".upload-{secrets.token_hex(8)}"  # named for an instant: linkat cannot replace
            os.link(f"/proc/self/fd/{self._fd}", temporary, dst_dir_fd=self._parent, follow_symlinks=True)
            os.rename(temporary, name, src_dir_fd=self._parent, dst_dir_fd=self._parent)
            return _lstat(self._parent, name, self._parts)
        except OSError as exc:
            raise _refusal(exc, self._parts) from None
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Close it; bytes not linked in yet are gone with the descriptor. Idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            os.close(self._parent)
            self._fd = -1


def update(volume: Path, path: str, *, uid: int | None, gid: int | None, mode: int | None) -> dict[str, object]:
    """Change the owner and mode of `path` (a symlink's own owner; its mode is left)."""
    parts = _parts(path)
    with _root(volume) as root:
        if not parts:
            raise VolumeError(400, "the volume's root keeps its owner and mode")
        with _directory(root, parts[:-1]) as parent:
            _own(parent, parts[-1], uid, gid, mode, parts)
            return _lstat(parent, parts[-1], parts)


def remove(volume: Path, path: str) -> None:
    """Remove `path`: a file or symlink, or a directory with everything in it."""
    parts = _parts(path)
    if not parts:
        raise VolumeError(400, "the volume's root cannot be removed (destroy the volume)")
    with _root(volume) as root, _directory(root, parts[:-1]) as parent:
        try:
            if stat.S_ISDIR(os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode):
                shutil.rmtree(parts[-1], dir_fd=parent)
            else:
                os.unlink(parts[-1], dir_fd=parent)
        except OSError as exc:
            raise _refusal(exc, parts) from None
