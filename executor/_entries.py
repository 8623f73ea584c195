"""`EntryInfo` for a path, filled the way envd fills it.

The entry describes the path itself (lstat): its name, size, permissions string (`-rw-r--r--`),
owner and group names (numbers when unknown), and modification time (RFC 3339, UTC). A symlink
reports its target's type and permission bits in `type`/`mode`, `isSymlink: true`, and the fully
resolved target in `symlinkTarget`; a broken link has type FILE_TYPE_UNSPECIFIED. `metadata` is the
file's `user.e2b.*` xattrs (`_metadata`; a link shows its target's).
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import stat
import time

from executor._errors import os_errors
from executor._metadata import read_metadata
from executor.envd import EntryInfo

__all__ = ("FILE_TYPE_DIRECTORY", "entry_from_stat", "entry_info")

FILE_TYPE_FILE = "FILE_TYPE_FILE"
FILE_TYPE_DIRECTORY = "FILE_TYPE_DIRECTORY"
FILE_TYPE_UNSPECIFIED = "FILE_TYPE_UNSPECIFIED"


def entry_info(path: str) -> EntryInfo:
    """The entry for `path`; NotFound if there is nothing there."""
    with os_errors(f"error getting file info of '{path}'"):
        return entry_from_stat(path, os.lstat(path))


def entry_from_stat(path: str, info: os.stat_result) -> EntryInfo:
    """The entry for `path`, whose lstat() result is `info`."""
    target_mode = info.st_mode
    symlink_target = None
    if stat.S_ISLNK(info.st_mode):
        symlink_target = _resolve_link(path)
        try:
            target_mode = os.stat(path).st_mode
        except OSError:
            target_mode = 0
    return EntryInfo(
        name=os.path.basename(path.rstrip("/")) or "/",
        type=_file_type(target_mode),
        path=path,
        size=str(info.st_size),
        mode=stat.S_IMODE(target_mode) & 0o777,
        permissions=stat.filemode(info.st_mode),
        owner=_user_name(info.st_uid),
        group=_group_name(info.st_gid),
        modified_time=rfc3339(info.st_mtime_ns),
        symlink_target=symlink_target,
        metadata=read_metadata(path),
        is_symlink=symlink_target is not None,
    )


def rfc3339(nanoseconds: int) -> str:
    """`2025-01-02T03:04:05.123456789Z`: what protobuf's Timestamp JSON form looks like."""
    seconds, nanos = divmod(nanoseconds, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + (f".{nanos:09d}Z" if nanos else "Z")


def _file_type(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE_TYPE_FILE
    if stat.S_ISDIR(mode):
        return FILE_TYPE_DIRECTORY
    return FILE_TYPE_UNSPECIFIED


def _resolve_link(path: str) -> str:
    try:
        return os.path.realpath(path, strict=True)
    except OSError:
        return path


def _user_name(uid: int) -> str:
    try:
        return _passwd_name(uid)
    except KeyError:
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        return _group_file_name(gid)
    except KeyError:
        return str(gid)


@functools.lru_cache(maxsize=256)
def _passwd_name(uid: int) -> str:
    """Cached: ListDir asks once per entry. A miss raises and is not cached (users get added)."""
    return pwd.getpwuid(uid).pw_name


@functools.lru_cache(maxsize=256)
def _group_file_name(gid: int) -> str:
    return grp.getgrgid(gid).gr_name
