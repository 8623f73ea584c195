"""Thin ctypes wrappers for the Linux calls Python 3.11's `os` lacks (namespaces, mounts, prctl)."""

from __future__ import annotations

import ctypes
import os

__all__ = [
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWUSER",
    "MS_BIND",
    "MS_NODEV",
    "MS_NOSUID",
    "attach_idmapped",
    "bind_idmapped",
    "clone_tree",
    "make_mounts_private",
    "mount",
    "set_child_subreaper",
    "setns",
    "unmount_lazily",
    "unshare",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000

_MS_REC = 0x4000
_MNT_DETACH = 2
_MS_PRIVATE = 0x40000
_PR_SET_CHILD_SUBREAPER = 36
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40
_MOUNT_ATTR_IDMAP = 0x00100000
_MOUNT_ATTR_RDONLY = 0x1
# The new mount API has one syscall number on every architecture (they were added after unification).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def mount(source: str, target: str, fstype: str, options: str, flags: int = 0) -> None:
    _check(
        _libc.mount(source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(flags), options.encode()),
        f"mount {source} at {target}",
    )


def unmount_lazily(target: str) -> None:
    """Detach the mount at `target` now; its filesystem goes once nothing uses it (umount2 MNT_DETACH)."""
    _check(_libc.umount2(target.encode(), _MNT_DETACH), f"umount {target}")


def make_mounts_private() -> None:
    """Stop mounts made from here on from propagating back to the host (call after unshare(CLONE_NEWNS))."""
    _check(_libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None), "mount --make-rprivate /")


def bind_idmapped(source: str, target: str | int, userns_fd: int, *, read_only: bool) -> None:
    """Bind `source` at `target` (a path, or a descriptor of the directory to mount on), with its file owners
    shifted by the uid/gid map of `userns_fd`."""
    tree = clone_tree(source)
    try:
        attach_idmapped(tree, target, userns_fd, read_only=read_only)
    finally:
        os.close(tree)


def clone_tree(source: str) -> int:
    """A detached copy of the mount tree at `source` (open_tree OPEN_TREE_CLONE): it stays usable after the
    mounts at `source` are gone from this namespace."""
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
    return _check(_libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(), flags), f"open_tree {source}")


def attach_idmapped(tree: int, target: str | int, userns_fd: int, *, read_only: bool) -> None:
    """Attach the detached tree `tree` at `target` (a path or a directory's descriptor), id-mapped by `userns_fd`."""
    attr = _MountAttr(_MOUNT_ATTR_IDMAP | (_MOUNT_ATTR_RDONLY if read_only else 0), 0, 0, userns_fd)
    _check(
        _libc.syscall(
            _SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
        ),
        f"mount_setattr of {target}",
    )
    if isinstance(target, int):
        flags, target_dir, target_path = _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH, target, b""
    else:
        flags, target_dir, target_path = _MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD, target.encode()
    _check(_libc.syscall(_SYS_MOVE_MOUNT, tree, b"", target_dir, target_path, flags), f"move_mount {target}")


def set_child_subreaper() -> None:
    """Become the reaper of orphaned descendants (pid 1 on these machines reaps late)."""
    _check(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
