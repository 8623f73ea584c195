"""Shifting a tree's ids from one sandbox's host range to another: a committed layer's from its build sandbox's
range back to the canonical one (from 0), a fork's writable layer from its source's range to its own.

Owners are not the only ids a file carries. A file capability written by root inside a sandbox is stored as a
v3 `security.capability` naming that root's host id (`rootid`), and chown clears it; POSIX ACLs
(`system.posix_acl_access`, `..._default`) name users and groups by host id. Both are rewritten here, so that
`setcap cap_net_bind_service=+ep` or `setfacl -m u:app:rx` in a template step still holds in every sandbox
that maps the layer to its own range. The formats are the kernel's (`include/uapi/linux/capability.h`,
`include/uapi/linux/posix_acl_xattr.h`).

A capability rooted at the build's root becomes the v2 form, which the host honours too (as it honours a
setuid-root file a step made): the image cache's layers directory is root's alone (`ImageStore`), so no
unprivileged user of the host can reach them by path.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path

from pool._local._userns import IDS_PER_SANDBOX

__all__ = ["shift_ids"]

_CAPABILITY = "security.capability"
_ACLS = ("system.posix_acl_access", "system.posix_acl_default")
_CAP_REVISION_MASK, _CAP_REVISION_2, _CAP_REVISION_3 = 0xFF000000, 0x02000000, 0x03000000
_CAP_V2_SIZE, _CAP_V3_SIZE = 20, 24
_ACL_HEADER, _ACL_ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
_ACL_USER, _ACL_GROUP = 0x02, 0x08  # the tags whose entries name an id


def shift_ids(root: Path, base: int, to: int = 0) -> None:
    """Give every entry under `root` owned by ids `base`.. the same ids counted from `to` (the canonical range by
    default; another sandbox's for a fork), and its file capability and ACLs the same shift (blocking; a walk
    that follows no symlink, failing on a directory it cannot list).

    The two ranges must not overlap: an id the shift produced is then outside the range it shifts, so an inode
    met twice (hard links) is shifted once."""
    if abs(to - base) < IDS_PER_SANDBOX:
        raise ValueError(f"id range {base}.. overlaps the range {to}.. it would be shifted to")

    def shift(value: int) -> int:
        return value - base + to if base <= value < base + IDS_PER_SANDBOX else value

    paths = [str(root)]
    for directory, dirs, files in os.walk(root, onerror=_raise):
        paths.extend(os.path.join(directory, name) for name in (*dirs, *files))
    for path in paths:
        _shift_one(path, shift)


def _raise(error: OSError) -> None:
    raise error


def _shift_one(path: str, shift: Callable[[int], int]) -> None:
    st = os.lstat(path)
    link = stat.S_ISLNK(st.st_mode)
    names = () if link else os.listxattr(path, follow_symlinks=False)
    capability = os.getxattr(path, _CAPABILITY, follow_symlinks=False) if _CAPABILITY in names else None
    uid, gid = shift(st.st_uid), shift(st.st_gid)
    chowned = (uid, gid) != (st.st_uid, st.st_gid)
    if chowned:
        os.lchown(path, uid, gid)
        if not link and st.st_mode & 0o6000:
            os.chmod(path, stat.S_IMODE(st.st_mode))  # chown clears setuid and setgid bits: give them back
    if capability is not None:  # chown cleared it too, and its rootid may be the build's root
        shifted = _shifted_capability(capability, shift)
        if chowned or shifted != capability:
            os.setxattr(path, _CAPABILITY, shifted, follow_symlinks=False)
    for name in _ACLS:
        if name in names:
            acl = os.getxattr(path, name, follow_symlinks=False)
            if (shifted := _shifted_acl(acl, shift)) != acl:
                os.setxattr(path, name, shifted, follow_symlinks=False)


def _shifted_capability(value: bytes, shift: Callable[[int], int]) -> bytes:
    """A v3 capability's rootid shifted; one whose root becomes 0 is the v2 form, which means exactly that."""
    if len(value) != _CAP_V3_SIZE or struct.unpack_from("<I", value)[0] & _CAP_REVISION_MASK != _CAP_REVISION_3:
        return value  # v2 (host root's, no rootid) or unknown: as it was
    magic, rootid = struct.unpack_from("<I", value)[0], struct.unpack_from("<I", value, _CAP_V2_SIZE)[0]
    rootid = shift(rootid)
    if rootid == 0:
        return struct.pack("<I", magic & ~_CAP_REVISION_MASK | _CAP_REVISION_2) + value[4:_CAP_V2_SIZE]
    return value[:_CAP_V2_SIZE] + struct.pack("<I", rootid)


def _shifted_acl(value: bytes, shift: Callable[[int], int]) -> bytes:
    """The ACL with the ids of its user and group entries shifted (anything malformed stays as it was)."""
    count, extra = divmod(len(value) - _ACL_HEADER.size, _ACL_ENTRY.size)
    if count < 0 or extra:
        return value
    out = bytearray(value[: _ACL_HEADER.size])
    for index in range(count):
        tag, perm, ident = _ACL_ENTRY.unpack_from(value, _ACL_HEADER.size + index * _ACL_ENTRY.size)
        out += _ACL_ENTRY.pack(tag, perm, shift(ident) if tag in (_ACL_USER, _ACL_GROUP) else ident)
    return bytes(out)
