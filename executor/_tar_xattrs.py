"""Extended attributes in the archive: `user.*` xattrs as PAX records `SCHILY.xattr.<name>`, as GNU tar has them.

That is how file metadata (`user.e2b.*`, `_metadata`) and whatever else the sandbox's programs keep in
`user.*` survive a snapshot that goes through the archive. Other namespaces stay behind: `trusted.*` and
`security.*` are not root-inside's to set, and `system.*` (ACLs) the archive never had. tarfile writes PAX
records but never applies them (Debian 12's 3.11.2 included), so both directions are done here. Values
are bytes: they travel through tarfile's str headers with surrogateescape, which tarfile itself uses for
PAX values that are not UTF-8 (`hdrcharset=BINARY`), so any value comes back byte for byte.
"""

from __future__ import annotations

import errno
import os
import tarfile

from executor._errors import os_errors

__all__ = ("add_xattrs", "restore_xattrs")

RECORD = "SCHILY.xattr."
NAMESPACE = "user."
_NONE_HERE = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA})


def add_xattrs(info: tarfile.TarInfo, target: int | str) -> None:
    """Put the `user.*` xattrs of `target` (an open file, or the path of a directory) in `info`'s PAX records."""
    follow = isinstance(target, int)  # a descriptor is the file itself; os refuses it with follow_symlinks=False
    records = {}
    try:
        for name in os.listxattr(target, follow_symlinks=follow):
            if name.startswith(NAMESPACE):
                value = os.getxattr(target, name, follow_symlinks=follow)
                records[RECORD + name] = value.decode("utf-8", "surrogateescape")
    except OSError as exc:
        if exc.errno not in _NONE_HERE:
            raise
    if records:
        info.pax_headers = {**info.pax_headers, **records}


def restore_xattrs(members: list[tarfile.TarInfo], destination: str) -> None:
    """Set the recorded xattrs of every extracted file and directory (never through a link)."""
    for member in members:
        records = {key: value for key, value in member.pax_headers.items() if key.startswith(RECORD + NAMESPACE)}
        if not records or not (member.isreg() or member.isdir()):
            continue
        path = os.path.normpath(os.path.join(destination, member.name))
        with os_errors(f"error restoring the extended attributes of '{member.name}'"):
            for key, value in records.items():
                _set(path, key[len(RECORD) :], value.encode("utf-8", "surrogateescape"))


def _set(path: str, name: str, value: bytes) -> None:
    try:
        os.setxattr(path, name, value, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
