"""Unpacking a tar.gz into a directory, for `PUT /agent-sandbox/archive`.

The whole member list is checked before anything is written, and an archive that fails is refused
(InvalidArgument) with the directory untouched. Refused: names that are absolute or contain
`..`, the same name twice, a member below a symbolic link of the archive, a hard link to anything but
a regular file met earlier in the archive, device nodes and other special types, and a "." that is no
directory. Symbolic links themselves are restored as they were stored, wherever they point: the
packer stores a venv's `bin/python -> /usr/bin/python3` that way, and a link is only dangerous when
something is written through it, which cannot happen here.

Then tarfile extracts as root, with numeric owners and no extraction filter (`filter="fully_trusted"`
where tarfile has filters): modes (setuid included), uid/gid and mtimes come back exactly, which the
"data" and "tar" filters would change (they clear high mode bits) or refuse (absolute symbolic links).
The sandbox images run Debian 12's Python 3.11.2, whose `extractall` has no `filter` argument (3.11.4
added it), so the way is cleared by the iterator that hands `extractall` its members: tarfile takes
each member from it just before writing it, on every version. Clearing the way: whatever is at the
member's path is removed first unless both are directories (so no write lands through an existing
link or into another hard link's inode), and a member whose parent on disk is a symbolic link the
archive did not replace (its parent directory is not in the archive) is refused then, after the
members before it were written.
Last, the `user.*` xattrs the archive records are set (`_tar_xattrs`). Entries on disk that the archive
does not name are left alone. A corrupt archive can likewise fail
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
from collections.abc import Iterator
from typing import BinaryIO

from executor._errors import InvalidArgument
from executor._tar_xattrs import restore_xattrs

__all__ = ("unpack",)

# Extract as stored: Python 3.14 defaults to the "data" filter; 3.11.2 (the images) has no filters at all.
_HAS_FILTERS = hasattr(tarfile, "fully_trusted_filter")


def unpack(archive: BinaryIO, root: str) -> None:
    """Extract the tar.gz `archive` into `root` (created when missing); InvalidArgument for a bad archive."""
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            members = tar.getmembers()
            _check(members)
            os.makedirs(root, exist_ok=True)
            destination = os.path.realpath(root)
            cleared = _clearing_way(members, destination)
            if _HAS_FILTERS:
                tar.extractall(destination, cleared, numeric_owner=True, filter="fully_trusted")
            else:
                tar.extractall(destination, cleared, numeric_owner=True)
            restore_xattrs(members, destination)
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


def _clearing_way(members: list[tarfile.TarInfo], destination: str) -> Iterator[tarfile.TarInfo]:
    """Each member, once the way to it is clear (see the module docstring)."""
    for member in members:
        target = os.path.normpath(os.path.join(destination, member.name))
        parent = os.path.dirname(target) if target != destination else target
        if os.path.realpath(parent) != parent:
            raise InvalidArgument(f"archive member '{member.name}' would be written through a symbolic link")
        try:
            status = os.lstat(target)
        except FileNotFoundError:
            yield member
            continue
        if stat.S_ISDIR(status.st_mode) and not member.isdir():
            shutil.rmtree(target)
        elif not stat.S_ISDIR(status.st_mode):
            os.unlink(target)
        yield member
