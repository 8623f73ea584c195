"""File metadata as envd 0.6.2 keeps it: extended attributes `user.e2b.<key>` on the file.

An upload's `X-Metadata-<key>: <value>` headers are its metadata (keys lower-cased; an empty key is
dropped; a header sent twice arrives as one value, its values joined by ", " as HTTP lists are). Keys
and values must be printable US-ASCII, a key at most `MAX_KEY_BYTES` (the kernel caps an xattr name at
255 bytes, prefix included) and the whole set at most `MAX_TOTAL_BYTES` (ext4 keeps an inode's xattrs
in one 4 KiB block; counted as envd does: prefix + key + value per entry); anything else is refused
with 400 before a byte is written. An upload replaces the file's whole set, so keys of an earlier
upload do not linger (O_TRUNC keeps xattrs). Reading follows symbolic links, as getxattr(2) does, and
skips entries that are not UTF-8 (set from inside with setfattr). A filesystem without xattrs (/proc,
some tmpfs) keeps none: the upload still succeeds and reports what was kept, which is nothing.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping

from executor._errors import InvalidArgument, os_errors

__all__ = (
    "HEADER_PREFIX",
    "MAX_KEY_BYTES",
    "MAX_TOTAL_BYTES",
    "PREFIX",
    "metadata_from_headers",
    "read_metadata",
    "replace_metadata",
)

PREFIX = "user.e2b."
HEADER_PREFIX = "x-metadata-"
MAX_KEY_BYTES = 255 - len(PREFIX)
MAX_TOTAL_BYTES = 4096
_UNSUPPORTED = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP})


def metadata_from_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The metadata of an upload (its lower-cased `x-metadata-*` headers), validated: InvalidArgument if bad."""
    metadata = {
        name[len(HEADER_PREFIX) :]: value
        for name, value in headers.items()
        if name.startswith(HEADER_PREFIX) and len(name) > len(HEADER_PREFIX)
    }
    _validate(metadata)
    return metadata


def _validate(metadata: dict[str, str]) -> None:
    total = 0
    for key, value in metadata.items():
        if len(key) > MAX_KEY_BYTES:
            raise InvalidArgument(f"invalid metadata: metadata key {key!r} exceeds {MAX_KEY_BYTES} bytes")
        for label, text in (("key", key), (f"value for key {key!r}", value)):
            if not (text.isascii() and text.isprintable()):
                raise InvalidArgument(f"invalid metadata: metadata {label} contains a non-printable-ASCII byte")
        total += len(PREFIX) + len(key) + len(value)
    if total > MAX_TOTAL_BYTES:
        raise InvalidArgument(f"invalid metadata: total metadata size {total} exceeds {MAX_TOTAL_BYTES} bytes")


def read_metadata(path: str) -> dict[str, str]:
    """The metadata of `path` (through a symbolic link); {} when it has none or its filesystem has no xattrs."""
    try:
        names = os.listxattr(path)
    except OSError:
        return {}  # unsupported, vanished, or a broken link: no metadata to show
    metadata = {}
    for name in names:
        if name.startswith(PREFIX):
            try:
                metadata[name[len(PREFIX) :]] = os.getxattr(path, name).decode()
            except (OSError, UnicodeDecodeError):
                continue  # removed meanwhile, or not UTF-8: left out rather than failing the listing
    return metadata


def replace_metadata(fd: int, path: str, metadata: dict[str, str]) -> None:
    """Make `metadata` the whole set of the open file `fd`; a filesystem without xattrs is left as it is."""
    with os_errors(f"error writing file metadata of '{path}'"):
        try:
            for name in os.listxattr(fd):
                if name.startswith(PREFIX) and name[len(PREFIX) :] not in metadata:
                    os.removexattr(fd, name)
            for key, value in metadata.items():
                os.setxattr(fd, PREFIX + key, value.encode())
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:
                raise
