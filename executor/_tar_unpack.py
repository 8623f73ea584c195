"""Unpacking a tar.gz into a directory, for `PUT /agent-sandbox/archive`.

The whole member list is checked before anything is written, and an archive that fails is refused
(InvalidArgument) with the directory untouched. Refused: names that are absolute or contain
`..`, the same name twice, a member below a symbolic link of the archive, a hard link to anything but
a regular file met earlier in the archive, device nodes and other special types, and a "." that is no
directory. Symbolic links themselves are restored as they were stored, wherever they point: the
packer stores a venv's `bin/python -> /usr/bin/python3` that way, and a link is only dangerous when
something is written through it, which cannot happen here.

Then tarfile extracts with `filter="fully_trusted"`, as root, with numeric owners: modes (setuid
included), uid/gid and mtimes come back exactly, which the "data" and "tar" filters would change
(they clear high mode bits) or refuse (absolute symbolic links). The filter hook still runs just
before each member is written, and clears its way: whatever is at the member's path is removed
first unless both are directories (so no write lands through an existing link or into another hard
link's inode), and a member whose parent on disk is a symbolic link the archive did not replace (its
parent directory is not in the archive) is refused then, after the members before it were written.
Entries on disk that the archive does not name are left alone. A corrupt archive can likewise fail
half-way: InvalidArgument too.
"""

from __future__ import annotations

import gzip
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from typing import BinaryIO

from executor._errors import InvalidArgument

__all__ = ("unpack",)


def unpack(archive: BinaryIO, root: str) -> None:
    """Extract the tar.gz `archive` into `root` (created when missing); InvalidArgument for a bad archive."""
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            members = tar.getmembers()
            _check(members)
            os.makedirs(root, exist_ok=True)
            destination = os.path.realpath(root)
            tar.extractall(destination, members, numeric_owner=True, filter=_ClearWay(destination))
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InvalidArgument(f"invalid archive: {exc}") from exc


def _check(members: list[tarfile.TarInfo]) -> None:
    names: set[str] = set()
    links: set[str] = set()
    files: set[str] = set()
    for member in members:
        name = _clean(member.name)
        if name in names:
            raise InvalidArgument(f"archive member '{name}' appears twice")
        if any(parent in links for parent in _parents(name)):
            raise InvalidArgument(f"archive member '{name}' lies below a symbolic link")
        if name == "." and not member.isdir():
            raise InvalidArgument("archive member '.' is not a directory")
        if member.islnk() and _clean(member.linkname) not in files:
            raise InvalidArgument(f"archive member '{name}' is a hard link to '{member.linkname}', not an earlier file")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk() or member.isfifo()):
            raise InvalidArgument(f"archive member '{name}' is a device or of an unsupported type")
        names.add(name)
        if member.issym():
            links.add(name)
        elif member.isreg():
            files.add(name)


def _clean(name: str) -> str:
    """The normalised relative name; InvalidArgument when it is absolute or climbs with `..`."""
    if name.startswith("/") or ".." in name.split("/"):
        raise InvalidArgument(f"archive member '{name}' is absolute or contains '..'")
    return posixpath.normpath(name) if name else "."


def _parents(name: str) -> list[str]:
    parts = name.split("/")[:-1]
    return ["/".join(parts[: index + 1]) for index in range(len(parts))]


class _ClearWay:
    """The tarfile filter: makes room for each member just before it is extracted (see the module docstring)."""

    def __init__(self, destination: str) -> None:
        self._destination = destination

    def __call__(self, member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo:
        target = os.path.normpath(os.path.join(self._destination, member.name))
        parent = os.path.dirname(target) if target != self._destination else target
        if os.path.realpath(parent) != parent:
            raise InvalidArgument(f"archive member '{member.name}' would be written through a symbolic link")
        try:
            status = os.lstat(target)
        except FileNotFoundError:
            return member
        if stat.S_ISDIR(status.st_mode) and not member.isdir():
            shutil.rmtree(target)
        elif not stat.S_ISDIR(status.st_mode):
            os.unlink(target)
        return member
