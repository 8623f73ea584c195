"""An image's layer tars applied, in order, into one directory, as host root, without trusting a byte of them.

The tars come from any registry, so every entry is treated as hostile:

* Names are relative to the directory; a `..` component is refused (`UnsafeImage`), a leading `/` dropped.
* Every directory on the way to an entry is resolved *inside* the directory: a symlink there (`lib ->
  usr/lib`, or `etc -> /etc` in a malicious image) is followed as the image's own root would follow it, an
  absolute or `..`-heavy target clamped at the directory, so nothing is ever created, removed or linked
  outside it. The entry's own name is never followed: what is there is replaced.
* Hard links must name an entry already inside the directory (resolved the same way); device nodes are
  skipped (a sandbox has no use for them, and host root would make working ones); only `user.*` and
  `security.capability` extended attributes are kept (`trusted.overlay.*` would speak to overlayfs).

OCI whiteouts remove what the image's earlier layers put there: `.wh.<name>` that entry, `.wh..wh..opq` every
entry of its directory. They are applied before the layer's own entries, as overlayfs applies the whiteouts
and opaque directories of an upper layer before its files, whatever order the tar lists them in. The
directory is the template's bottom layer, with nothing below it, so no whiteout has to survive in it.

Entries are written with plain system calls rather than `tarfile.extractall`, whose filters either refuse
what images need (absolute symlinks, setuid modes) or allow what is unsafe here (devices, any xattr). On a
330 MB Debian 12 root of 15,500 entries this takes 2.5 s here, against 3.6 s for `extractall`, 3.5 s for GNU
tar and 5.6 s for umoci 0.4.7's `unpack` (see `_oci`), and gives the same tree, owners and modes, devices aside.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["UnpackStats", "UnsafeImage", "apply_layer", "resolve_in_root"]

_WHITEOUT, _OPAQUE, _AUFS_META = ".wh.", ".wh..wh..opq", ".wh..wh."
_KEPT_XATTRS = ("user.", "security.capability")
_MAX_LINKS = 40  # symlinks followed while resolving one path, as Linux allows
_CHUNK = 1 << 20


class UnsafeImage(Exception):
    """A layer tar entry that would reach outside the directory or cannot be applied."""


class UnpackStats:
    """What applying the layers skipped, for the build log."""

    def __init__(self) -> None:
        self.entries = 0
        self.devices = 0


def apply_layer(tar_path: Path, root: Path, stats: UnpackStats) -> None:
    """Apply one uncompressed layer tar over the directory `root` (blocking)."""
    with tarfile.open(tar_path, "r:", errorlevel=2) as tar:
        members = tar.getmembers()  # headers only: a seekable tar skips the contents
        for member in members:
            parts = _parts(member.name)
            if parts and parts[-1].startswith(_WHITEOUT):
                _whiteout(root, parts)
        dirs: list[tuple[Path, tarfile.TarInfo]] = []
        for member in members:
            parts = _parts(member.name)
            if not parts or parts[-1].startswith(_WHITEOUT):
                continue  # the root itself keeps the directory's own owner and mode
            stats.entries += 1
            path = _directory(root, parts[:-1], create=True) / parts[-1]
            if member.ischr() or member.isblk():
                stats.devices += 1
                continue
            _clear(path, keep_dir=member.isdir())
            if member.isdir():
                if not path.is_dir():
                    os.mkdir(path, 0o700)
                dirs.append((path, member))  # its times once its entries are in, which change them
            elif member.isreg():
                _write_file(tar, member, path)
            elif member.issym():
                os.symlink(member.linkname, path)
            elif member.islnk():
                _hard_link(root, member, path)
            elif member.isfifo():
                os.mkfifo(path, 0o600)
            else:
                raise UnsafeImage(f"{member.name}: unsupported tar entry type {member.type!r}")
            _metadata(path, member)
        for path, member in reversed(dirs):
            os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)


def resolve_in_root(root: Path, parts: Iterable[str], *, create: bool = False) -> Path:
    """The real path of `root`/`parts` as a chroot into `root` would find it: every symlink followed inside
    `root`, never out of it (an absolute target starts again at `root`, `..` stops there). Missing directories
    are made when `create`, else FileNotFoundError; UnsafeImage when a file stands where a directory must be
    or the links loop."""
    pending = list(parts)[::-1]
    resolved: list[str] = []
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if resolved:
                resolved.pop()
            continue
        path = root.joinpath(*resolved, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(path, 0o755)
            st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise UnsafeImage(f"too many levels of symbolic links at /{'/'.join((*resolved, name))}")
            target = os.readlink(path)
            if target.startswith("/"):
                resolved = []
            pending.extend(target.split("/")[::-1])
            continue
        if not stat.S_ISDIR(st.st_mode) and any(p not in ("", ".") for p in pending):
            raise UnsafeImage(f"/{'/'.join((*resolved, name))} is not a directory")
        resolved.append(name)
    return root.joinpath(*resolved)


def _directory(root: Path, parts: list[str], *, create: bool = False) -> Path:
    path = resolve_in_root(root, parts, create=create)
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise UnsafeImage(f"/{'/'.join(parts)} is not a directory")
    return path


def _parts(name: str) -> list[str]:
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeImage(f"{name!r}: a layer entry may not climb out with '..'")
    return parts


def _whiteout(root: Path, parts: list[str]) -> None:
    name = parts[-1]
    try:
        directory = resolve_in_root(root, parts[:-1])
    except FileNotFoundError:
        return  # nothing below to hide
    if not directory.is_dir() or directory.is_symlink():
        return
    if name == _OPAQUE:
        for child in os.listdir(directory):
            _remove(directory / child)
    elif not name.startswith(_AUFS_META):
        _remove(directory / name[len(_WHITEOUT) :])


def _clear(path: Path, *, keep_dir: bool) -> None:
    """Make room for a new entry at `path`: a directory stays (its entries merge) when one replaces it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if keep_dir and stat.S_ISDIR(st.st_mode):
        return
    _remove(path)


def _remove(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # fd-based on Linux: it never follows a symlink out
    else:
        os.unlink(path)


def _write_file(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> None:
    source = tar.extractfile(member)
    assert source is not None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            while chunk := source.read(_CHUNK):
                out.write(chunk)
    finally:
        os.close(fd)


def _hard_link(root: Path, member: tarfile.TarInfo, path: Path) -> None:
    parts = _parts(member.linkname)
    if not parts:
        raise UnsafeImage(f"{member.name}: a hard link to the root")
    try:
        target = _directory(root, parts[:-1]) / parts[-1]
        st = os.lstat(target)
    except FileNotFoundError as exc:
        raise UnsafeImage(f"{member.name}: hard link to {member.linkname!r}, which is not in the image") from exc
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeImage(f"{member.name}: hard link to the directory {member.linkname!r}")
    os.link(target, path, follow_symlinks=False)


def _metadata(path: Path, member: tarfile.TarInfo) -> None:
    if member.islnk():
        return  # the link shares its target's inode: owner, mode and times are the target's
    os.lchown(path, member.uid, member.gid)
    if not member.issym():
        os.chmod(path, stat.S_IMODE(member.mode))  # after chown, which clears setuid and setgid
    for key, value in member.pax_headers.items():
        name = key.removeprefix("SCHILY.xattr.")
        if name != key and name.startswith(_KEPT_XATTRS):
            os.setxattr(path, name, value.encode("utf-8", "surrogateescape"), follow_symlinks=False)
    if not member.isdir():
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
