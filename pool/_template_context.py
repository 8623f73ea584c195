"""The files a built-in (TOML) template's `copy` layer takes from its templates directory.

The E2B SDK uploads a COPY step's files as a tar archive named by its hash; a TOML template names a path under
its templates directory instead (`source = "files/app"`). Loading the template hashes what is there now
(`context_hash`: every name, mode, link target and byte below it), so the layer's key changes exactly when the
files do; building it packs the same files into the tar the COPY step unpacks (`pack_context`), and refuses a
tree that changed since it was hashed. Nothing outside the templates directory is read: a path that leaves it,
also through a symlink, is refused.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

__all__ = ["ContextError", "context_hash", "context_path", "pack_context"]


class ContextError(Exception):
    """A copy layer's path is not usable: outside the templates directory, missing, or changed since loading."""


def context_path(root: Path, source: str) -> Path:
    """`source` (relative) under `root`, checked to stay inside it once symlinks are resolved."""
    if not source or os.path.isabs(source):
        raise ContextError(f"copy source {source!r}: a path relative to the templates directory")
    path = root / source
    if not path.resolve().is_relative_to(root.resolve()):
        raise ContextError(f"copy source {source!r} is outside the templates directory {root}")
    if not path.exists():
        raise ContextError(f"copy source {source!r}: no such file or directory under {root}")
    return path


def context_hash(root: Path, source: str) -> str:
    """The SHA-256 of what `source` holds under `root`: the sorted names below it with their kind, mode, link
    target and contents (not their times or owners, which the copy does not keep)."""
    top = context_path(root, source)
    digest = hashlib.sha256()
    for path in _walk(top):
        info = path.lstat()
        name = path.relative_to(top).as_posix()
        digest.update(f"{name}\0{stat.S_IFMT(info.st_mode)}\0{stat.S_IMODE(info.st_mode):o}\0".encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            with open(path, "rb") as file:
                for chunk in iter(lambda: file.read(1 << 20), b""):
                    digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def pack_context(root: Path, source: str, expected: str) -> bytes:
    """The tar archive the COPY step unpacks: `source` under its own relative name, its symlinks as links.
    ContextError when the files no longer hash to `expected` (edited since the templates were loaded)."""
    if context_hash(root, source) != expected:
        raise ContextError(f"copy source {source!r} changed since the templates were loaded: load them again")
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as archive:
        archive.add(context_path(root, source), arcname=source, recursive=True)
    return packed.getvalue()


def _walk(top: Path) -> list[Path]:
    """`top` and everything below it, sorted by name; symlinks are not followed."""
    found = [top]
    if top.is_dir() and not top.is_symlink():
        for parent, dirs, files in os.walk(top):
            dirs.sort()
            found += [Path(parent, name) for name in sorted([*dirs, *files])]
    return sorted(found)
