"""The file operations of `/files` and `filesystem.Filesystem`, each a function of plain arguments.

Each runs with the rights of whoever calls it: in the executor for root, in a helper process running
as the named user for anyone else (`_as_user`), so that the kernel makes every check (permissions,
path traversal, symbolic links, /proc) as for a shell of that user. `OPS` are the ones a helper runs;
their arguments and results cross its socket as msgpack, and a `Descriptor`'s file descriptor with them.

An upload that fails (`abandon_upload`) leaves nothing behind, and an old file survives it. A new file
is written where it belongs (a watcher sees it made and written, as with envd) and removed if the
upload fails. An existing one is replaced: the upload goes to a temporary file beside it, with its mode,
renamed over it at the end (`finish_upload`; a watcher sees the temporary name, then a rename). Either
has the upload's metadata and is owned by uid:gid, like the directories made for it (removed too if it
fails). A link is written through, to the file it names. Three destinations are written in place, as a
shell's `>` would: one that is no regular file (a FIFO, /dev/null); a file its user may write in a
directory it may not (there a failed upload leaves the file cut); and another's file in a sticky
directory such as /tmp, which may be written but not replaced (copied into once the upload is complete).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat as stat_module
from collections.abc import Callable

import msgspec

from executor._entries import FILE_TYPE_DIRECTORY, entry_from_stat, entry_info
from executor._errors import AlreadyExists, InvalidArgument, NotFound, os_errors
from executor._metadata import read_metadata, replace_metadata
from executor._paths import ensure_dirs
from executor.envd import EntryInfo

__all__ = (
    "OPS",
    "Descriptor",
    "Upload",
    "abandon_upload",
    "check_directory",
    "finish_upload",
    "list_dir",
    "make_dir",
    "move",
    "open_for_download",
    "open_for_upload",
    "remove",
    "stat",
)


class Descriptor(msgspec.Struct):
    """An open file for the caller, who closes `fd`; a helper sends the descriptor itself along."""

    fd: int


class Upload(Descriptor):
    """Where an upload's bytes go: `temporary` until `finish_upload` renames it (None: straight to `destination`)."""

    temporary: str | None = None
    destination: str = ""
    created: list[str] = []  # directories made for it, outermost first
    partial: str | None = None  # what `abandon_upload` removes: the temporary or the new file, never an old one


def stat(path: str) -> EntryInfo:
    return entry_info(path)


def make_dir(path: str, uid: int, gid: int) -> EntryInfo:
    if os.path.isdir(path):
        raise AlreadyExists(f"directory already exists: {path}")
    if os.path.lexists(path):
        raise InvalidArgument(f"path already exists but it is not a directory: {path}")
    ensure_dirs(path, uid, gid)
    return entry_info(path)


def move(source: str, destination: str, uid: int, gid: int) -> EntryInfo:
    with os_errors(f"error moving '{source}' to '{destination}'"):
        try:
            os.lstat(source)
        except FileNotFoundError:
            raise NotFound(f"source file not found: {source}") from None
        ensure_dirs(os.path.dirname(destination), uid, gid)
        os.rename(source, destination)
    return entry_info(destination)


def list_dir(path: str, depth: int) -> list[EntryInfo]:
    with os_errors(f"error listing '{path}'"):
        real = os.path.realpath(path, strict=True)
    if not os.path.isdir(real):
        raise InvalidArgument(f"path is not a directory: {path}")
    entries: list[EntryInfo] = []
    with os_errors(f"error reading directory '{path}'"):
        _walk(path, real, max(depth, 1), entries)
    return entries


def _walk(shown: str, real: str, depth: int, entries: list[EntryInfo]) -> None:
    """Depth-first, in name order, not following symlinks; entries are named under `shown`."""
    with os.scandir(real) as iterator:
        children = sorted(iterator, key=lambda child: child.name)
    for child in children:
        entry = entry_from_stat(os.path.join(shown, child.name), child.stat(follow_symlinks=False))
        entries.append(entry)
        if depth > 1 and entry.type == FILE_TYPE_DIRECTORY and not entry.is_symlink:
            _walk(entry.path, child.path, depth - 1, entries)


def remove(path: str) -> None:
    """Like envd's `os.RemoveAll`: a whole tree, a link (not what it points to), and nothing to remove is fine."""
    with os_errors(f"error removing file or directory '{path}'"), contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def check_directory(path: str) -> None:
    """That `path` is a directory its caller may read (what watching it takes)."""
    with os_errors(f"error watching '{path}'"):
        if not stat_module.S_ISDIR(os.stat(path).st_mode):
            raise InvalidArgument(f"path {path} is not a directory")
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))


def open_for_download(path: str) -> Descriptor:
    with os_errors(f"error opening '{path}'"):
        try:  # O_NONBLOCK: a FIFO with no writer must not hang the caller
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(f"path '{path}' does not exist") from None
        if stat_module.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidArgument(f"path '{path}' is a directory")
    return Descriptor(fd)


def open_for_upload(path: str, uid: int, gid: int, metadata: dict[str, str]) -> Upload:
    created = ensure_dirs(os.path.dirname(path), uid, gid)
    try:
        return _open_for_upload(path, os.path.realpath(path), (uid, gid), metadata, created)
    except BaseException:
        abandon_upload(None, created)
        raise


def _open_for_upload(
    path: str, destination: str, owner: tuple[int, int], metadata: dict[str, str], created: list[str]
) -> Upload:
    with os_errors(f"error opening '{path}' for writing"):
        try:
            old = os.stat(destination)
        except FileNotFoundError:
            fd = _create(destination)
            if fd is not None:
                return _prepared(Upload(fd, None, destination, created, destination), path, owner, None, metadata)
            old = os.stat(destination)  # made meanwhile: replaced as any old file is
        if stat_module.S_ISDIR(old.st_mode):
            raise InvalidArgument(f"path is a directory: {path}")
        temporary = os.path.join(os.path.dirname(destination), f".{os.urandom(8).hex()}.upload")
        fd = None if not stat_module.S_ISREG(old.st_mode) else _create(temporary, in_place_if_denied=True)
        if fd is None:
            return _in_place(destination, path, metadata, created)
    upload = Upload(fd, temporary, destination, created, temporary)
    return _prepared(upload, path, owner, stat_module.S_IMODE(old.st_mode), metadata)


def _create(path: str, in_place_if_denied: bool = False) -> int | None:
    """A new file at `path`; None if one is there already (or, when asked, if the directory may not be written)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        return None
    except PermissionError:
        if in_place_if_denied:
            return None
        raise


def _prepared(upload: Upload, path: str, owner: tuple[int, int], mode: int | None, metadata: dict[str, str]) -> Upload:
    """`upload` once its new file has its owner, the old file's mode and the metadata; removed if that fails."""
    try:
        with os_errors(f"error opening '{path}' for writing"):
            os.fchown(upload.fd, *owner)
            if mode is not None:
                os.fchmod(upload.fd, mode)
        replace_metadata(upload.fd, path, metadata)
    except BaseException:
        os.close(upload.fd)
        abandon_upload(upload.partial, [])
        raise
    return upload


def _in_place(destination: str, path: str, metadata: dict[str, str], created: list[str]) -> Upload:
    with os_errors(f"error opening '{path}' for writing"):  # O_NONBLOCK: a FIFO nobody reads is ENXIO, not a hang
        fd = os.open(destination, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(fd, True)
    try:
        replace_metadata(fd, path, metadata)
    except BaseException:
        os.close(fd)
        raise
    return Upload(fd, None, destination, created)


def finish_upload(temporary: str | None, destination: str, path: str) -> EntryInfo:
    """Put the upload in place; its entry in the answer (envd's REST form), metadata read back from disk."""
    if temporary is not None:
        with os_errors(f"error writing '{path}'"):
            try:
                os.rename(temporary, destination)
            except PermissionError:  # a sticky directory: another's file its user may write, not replace
                _copy_over(temporary, destination, path)
    return EntryInfo(os.path.basename(path), "file", path, metadata=read_metadata(path))


def _copy_over(temporary: str, destination: str, path: str) -> None:
    """Write the finished upload into the old file, as a shell's `>` would, and remove the temporary file."""
    fd = os.open(destination, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    with open(temporary, "rb") as source, os.fdopen(fd, "wb") as target:
        shutil.copyfileobj(source, target)
        replace_metadata(target.fileno(), path, read_metadata(temporary))
    os.unlink(temporary)


def abandon_upload(partial: str | None, created: list[str]) -> None:
    """Remove what an upload that failed had made: its new or temporary file and the directories made for it."""
    if partial is not None:
        with contextlib.suppress(OSError):
            os.unlink(partial)
    for directory in reversed(created):
        with contextlib.suppress(OSError):  # not empty: another upload put something there meanwhile
            os.rmdir(directory)


OPS: dict[str, Callable[..., object]] = {
    op.__name__: op
    for op in (
        stat,
        make_dir,
        move,
        list_dir,
        remove,
        check_directory,
        open_for_download,
        open_for_upload,
        finish_upload,
        abandon_upload,
    )
}
