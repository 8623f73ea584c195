"""A committed layer's ids go back to the canonical range whole: owners, setuid bits, file capabilities (v3,
naming the build's root) and POSIX ACL entries, as the kernel stores them."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pytest

from pool._local._id_shift import shift_ids

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown and security.* xattrs need root")

BASE = 3_000_000_000  # a build sandbox's host range, far above any running test's
NET_BIND_SERVICE = 1 << 10
_EFFECTIVE = 0x000001


def _capability(rootid: int | None) -> bytes:
    """`security.capability` granting CAP_NET_BIND_SERVICE: v3 naming `rootid`, or v2 (None)."""
    magic = (0x03000000 if rootid is not None else 0x02000000) | _EFFECTIVE
    data = struct.pack("<IIIII", magic, NET_BIND_SERVICE, 0, 0, 0)
    return data if rootid is None else data + struct.pack("<I", rootid)


def _acl(user: int, group: int) -> bytes:
    entries = [(0x01, 7, 0xFFFFFFFF), (0x02, 5, user), (0x04, 5, 0xFFFFFFFF), (0x08, 5, group),
               (0x10, 5, 0xFFFFFFFF), (0x20, 5, 0xFFFFFFFF)]  # fmt: skip
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def _set(path: Path, name: str, value: bytes) -> None:
    try:
        os.setxattr(path, name, value)
    except OSError as exc:
        if exc.errno == errno.EOPNOTSUPP:
            pytest.skip(f"{name} is not supported on {path.parent}")
        raise


def test_owners_setuid_capabilities_and_acls_are_shifted_together(tmp_path: Path) -> None:
    root = tmp_path / "layer"
    (root / "usr/bin").mkdir(parents=True)
    tool, other, shared = root / "usr/bin/tool", root / "usr/bin/other", root / "shared"
    for path in (tool, other):
        path.write_bytes(b"#!/bin/sh\n")
        os.chown(path, BASE + 5, BASE + 6)
        os.chmod(path, 0o4755)
    shared.mkdir()
    os.chown(root, BASE, BASE)
    _set(tool, "security.capability", _capability(BASE))  # setcap by the build sandbox's root
    _set(other, "security.capability", _capability(BASE + 3))  # by a user namespace below it, rooted at its 3
    _set(shared, "system.posix_acl_access", _acl(BASE + 7, BASE + 8))
    _set(shared, "system.posix_acl_default", _acl(BASE + 7, 42))  # 42: a host id outside the range stays

    shift_ids(root, BASE)

    st = os.stat(tool)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (5, 6, 0o4755)
    assert (os.stat(root).st_uid, os.stat(root).st_gid) == (0, 0)
    assert os.getxattr(tool, "security.capability") == _capability(None)  # rooted at 0: the v2 form
    assert os.getxattr(other, "security.capability") == _capability(3)
    assert os.getxattr(shared, "system.posix_acl_access") == _acl(7, 8)
    assert os.getxattr(shared, "system.posix_acl_default") == _acl(7, 42)


def test_entries_of_other_owners_and_links_are_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "layer"
    root.mkdir()
    kept = root / "kept"
    kept.write_text("x")
    os.chown(kept, 1000, 1000)  # already canonical (a layer below it, or the host's)
    (root / "link").symlink_to("/nonexistent")
    os.lchown(root / "link", BASE + 1, BASE + 1)
    shift_ids(root, BASE)
    assert (os.stat(kept).st_uid, os.stat(kept).st_gid) == (1000, 1000)
    assert os.lstat(root / "link").st_uid == 1


def test_acl_entries_are_shifted_on_their_own(tmp_path: Path) -> None:
    root = tmp_path / "layer"
    (root / "defaults").mkdir(parents=True)
    _set(root / "defaults", "system.posix_acl_default", _acl(BASE + 9, BASE + 9))  # a default ACL alone
    shift_ids(root, BASE)
    assert os.getxattr(root / "defaults", "system.posix_acl_default") == _acl(9, 9)


def test_a_hard_linked_file_is_shifted_once_and_v2_or_foreign_capabilities_stay(tmp_path: Path) -> None:
    root = tmp_path / "layer"
    root.mkdir()
    linked, v2, foreign = root / "linked", root / "v2", root / "foreign"
    for path in (linked, v2, foreign):
        path.write_bytes(b"\x7fELF")
    os.chown(linked, BASE + 2, BASE + 2)
    _set(linked, "security.capability", _capability(BASE))
    _set(linked, "system.posix_acl_access", _acl(BASE + 2, BASE + 2))
    os.link(linked, root / "again")  # the walk meets the inode twice
    _set(v2, "security.capability", _capability(None))  # host root's own: no rootid
    os.chown(foreign, 1000, 1000)  # owned outside the range: not chowned
    _set(foreign, "security.capability", _capability(BASE + 4))
    shift_ids(root, BASE)
    assert (os.stat(linked).st_uid, os.stat(linked).st_gid) == (2, 2)
    assert os.getxattr(root / "again", "security.capability") == _capability(None)
    assert os.getxattr(root / "again", "system.posix_acl_access") == _acl(2, 2)
    assert os.getxattr(v2, "security.capability") == _capability(None)
    assert os.getxattr(foreign, "security.capability") == _capability(4)
    assert os.stat(foreign).st_uid == 1000


def test_a_base_inside_the_canonical_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overlaps the range 0"):
        shift_ids(tmp_path, 1000)


def test_a_forks_layer_moves_from_its_sources_range_to_its_own(tmp_path: Path) -> None:
    """A fork's writable layer: the ids of the source's range move to the fork's, a capability stays v3 naming
    the fork's root, and a hard-linked inode is moved once."""
    root, to = tmp_path / "upper", BASE + 10 * 65536
    root.mkdir()
    tool, linked = root / "tool", root / "linked"
    tool.write_bytes(b"#!/bin/sh\n")
    os.link(tool, linked)
    os.chown(root, BASE, BASE)
    os.chown(tool, BASE + 1000, BASE + 1000)
    _set(tool, "security.capability", _capability(BASE))
    _set(root, "system.posix_acl_access", _acl(BASE + 7, 42))

    shift_ids(root, BASE, to)

    assert (os.stat(root).st_uid, os.stat(linked).st_uid, os.stat(linked).st_gid) == (to, to + 1000, to + 1000)
    assert os.getxattr(tool, "security.capability") == _capability(to)
    assert os.getxattr(root, "system.posix_acl_access") == _acl(to + 7, 42)
    with pytest.raises(ValueError, match="overlaps"):
        shift_ids(root, to, to + 65535)
