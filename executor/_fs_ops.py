"""The file operations of `/files`, `filesystem.Filesystem` (watches too) and the agent API's `/v1/fs`
(`agent_*`), each a function of plain arguments.

Each runs with the rights of whoever calls it: in the executor for root, in a helper process running
as the named user for anyone else (`_as_user`), so that the kernel makes every check (permissions,
path traversal, symbolic links, /proc) as for a shell of that user. `OPS` are the ones a helper runs;
their arguments and results cross its socket as msgpack, and a `Descriptor`'s file descriptor with them.
A watch is the one place where the executor acts on a helper's word rather than on what it handed over:
it watches the directories `check_directory` and `listable_directories` name (each only while its path
still names the directory found), so a helper its user had taken over could widen that user's watch.

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
from executor._errors import AlreadyExists, ExecutorError, InvalidArgument, NotFound, os_errors
from executor._metadata import read_metadata, replace_metadata
from executor._paths import ensure_dirs
from executor.envd import EntryInfo

__all__ = (
    "OPS",
    "Descriptor",
    "Directory",
    "Status",
    "Upload",
    "abandon_upload",
    "agent_entries",
    "agent_move",
    "agent_open_to_read",
    "agent_open_to_write",
    "agent_remove",
    "agent_stat",
    "check_directory",
    "entries",
    "finish_upload",
    "list_dir",
    "listable_directories",
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


class Directory(msgspec.Struct, array_like=True, frozen=True):
    """A directory as its caller's check found it: a watch is put on `path` only while it is still that one."""

    path: str
    device: int
    inode: int


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
        _remove_entry(path)


def _remove_entry(path: str) -> None:
    """A directory with everything in it, or one file or link (not what it points to)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def check_directory(path: str, recursive: bool) -> list[Directory]:
    """`path`, a directory its caller may read (what watching it takes), and with `recursive` every directory
    under it that its caller may list (`listable_directories`): what a watch of it as that user would cover."""
    with os_errors(f"error watching '{path}'"):
        if not stat_module.S_ISDIR(os.stat(path).st_mode):
            raise InvalidArgument(f"path {path} is not a directory")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            top = _directory(path, fd)
            children = _subdirectories(path, fd) if recursive else []
        finally:
            os.close(fd)
    return [top, *listable_directories(children)]


def listable_directories(paths: list[str]) -> list[Directory]:
    """Those of `paths` that are directories its caller may list, and every one under them it may list too.

    As the caller's own recursive watch would find them: each opened for reading by its path (so every
    directory on the way must let the caller in), links not followed; what cannot be is left out, with
    all that is under it.
    """
    found: list[Directory] = []
    pending = list(reversed(paths))
    while pending:
        path = pending.pop()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # gone, a link, not a directory, or not the caller's to list
            continue
        try:
            found.append(_directory(path, fd))
            pending.extend(reversed(_subdirectories(path, fd)))
        except OSError:
            continue
        finally:
            os.close(fd)
    return found


def _directory(path: str, fd: int) -> Directory:
    info = os.fstat(fd)
    return Directory(path, info.st_dev, info.st_ino)


def _subdirectories(path: str, fd: int) -> list[str]:
    with os.scandir(fd) as iterator:
        return sorted(os.path.join(path, child.name) for child in iterator if child.is_dir(follow_symlinks=False))


def entries(paths: list[str]) -> list[EntryInfo | None]:
    """The entry of each of `paths` as its caller may see it (None where it may not, or nothing is there)."""
    found: list[EntryInfo | None] = []
    for path in paths:
        try:
            found.append(entry_info(path))
        except ExecutorError:
            found.append(None)
    return found


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


class Status(msgspec.Struct, array_like=True, frozen=True):
    """An entry as `/v1/fs` tells of it (through a link, if that leads anywhere)."""

    path: str
    directory: bool
    size: int
    modified: float


def agent_entries(path: str) -> list[Status]:
    """`GET /v1/fs/entries`: the entries of a directory, in name order."""
    if _kind(path) != stat_module.S_IFDIR:
        raise InvalidArgument(f"path not found or not a directory: {path}")
    with os_errors(f"error listing '{path}'"), os.scandir(path) as iterator:
        return [_status(child.path) for child in sorted(iterator, key=lambda entry: entry.name)]


def agent_stat(path: str) -> Status:
    """`GET /v1/fs/stat`."""
    if _kind(path, follow=False) is None:
        raise InvalidArgument(f"path not found: {path}")
    with os_errors(f"error reading the status of '{path}'"):
        return _status(path)


def _status(path: str) -> Status:
    info = os.stat(path) if os.path.exists(path) else os.lstat(path)
    return Status(path, stat_module.S_ISDIR(info.st_mode), info.st_size, info.st_mtime)


def agent_open_to_read(path: str) -> Descriptor:
    """`GET /v1/fs/file`: the file, open for its caller to read."""
    if _kind(path) != stat_module.S_IFREG:
        raise InvalidArgument(f"path not found: {path}")
    with os_errors(f"error reading '{path}'"):  # O_NONBLOCK: a FIFO put there meanwhile must not hang the caller
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not stat_module.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise InvalidArgument(f"path not found: {path}")
    return Descriptor(fd)


def agent_open_to_write(path: str, uid: int, gid: int, mode: int | None) -> Descriptor:
    """`PUT /v1/fs/file` and each file of `upload-batch`: the file cut to nothing, open for its caller to write.

    Its missing parents are made first; a new file is owned by uid:gid, an old one keeps its owner (as after a
    shell's `>`); `mode` is set when given (a tar member's) and the caller may.
    """
    ensure_dirs(os.path.dirname(path), uid, gid)
    if _kind(path) == stat_module.S_IFDIR:
        raise InvalidArgument(f"path is a directory: {path}")
    with os_errors(f"error writing '{path}'"):
        try:
            fd, new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644), True
        except FileExistsError:  # O_NONBLOCK: a FIFO nobody reads is ENXIO, not a hang
            fd, new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC, 0o644), False
        try:
            os.set_blocking(fd, True)
            if new:
                os.fchown(fd, uid, gid)
            if mode is not None:
                _change_mode(fd, mode, new)
        except BaseException:
            os.close(fd)
            raise
    return Descriptor(fd)


def _change_mode(fd: int, mode: int, new: bool) -> None:
    try:
        os.fchmod(fd, mode)
    except PermissionError:
        if new:
            raise  # an old file of another's keeps its mode, as when its caller's own `tar x` writes it


def agent_remove(path: str, recursive: bool) -> None:
    """`DELETE /v1/fs/entry`: a file, a link (not what it points to), or a directory (with `recursive` a full one)."""
    kind = _kind(path, follow=False)
    if kind is None:
        raise InvalidArgument(f"path not found: {path}")
    with os_errors(f"error removing '{path}'"):
        if kind == stat_module.S_IFDIR and not recursive and os.listdir(path):
            raise InvalidArgument(f"directory is not empty (use recursive=true): {path}")
        _remove_entry(path)


def agent_move(source: str, target: str, overwrite: bool, uid: int, gid: int) -> None:
    """`POST /v1/fs/move`: the target's missing parents are made (owned by uid:gid); an existing target is
    replaced only with `overwrite`."""
    kind = _kind(source, follow=False)
    if kind is None:
        raise InvalidArgument(f"path not found: {source}")
    if _kind(target, follow=False) is not None and not overwrite:
        raise AlreadyExists(f"destination exists (use overwrite=true): {target}")
    if kind == stat_module.S_IFDIR and _within(target, source):
        raise InvalidArgument(f"cannot move '{source}' into itself: {target}")
    ensure_dirs(os.path.dirname(target), uid, gid)
    with os_errors(f"error moving '{source}' to '{target}'"):
        os.replace(source, target)


def _kind(path: str, follow: bool = True) -> int | None:
    """The file type of `path` (`S_IFMT`, through a link when `follow`); None if nothing is there."""
    with os_errors(f"error reading the status of '{path}'"):  # EACCES is PermissionDenied, not "not found"
        try:
            return stat_module.S_IFMT(os.stat(path, follow_symlinks=follow).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return None


def _within(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or would be inside it (its existing parents resolved)."""
    real, parent = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([real, parent]) == parent


OPS: dict[str, Callable[..., object]] = {
    op.__name__: op
    for op in (
        stat,
        make_dir,
        move,
        list_dir,
        remove,
        check_directory,
        listable_directories,
        entries,
        open_for_download,
        open_for_upload,
        finish_upload,
        abandon_upload,
        ensure_dirs,  # `POST /v1/fs/mkdir`
        agent_entries,
        agent_stat,
        agent_open_to_read,
        agent_open_to_write,
        agent_remove,
        agent_move,
    )
}
