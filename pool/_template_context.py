"""The files a built-in (TOML) template's `copy` layer takes from its templates directory.

The E2B SDK uploads a COPY step's files as a tar archive named by its hash; a TOML template names a path under
its templates directory instead (`source = "files/app"`). Loading the template packs what is there now into the
tar the COPY step unpacks and hashes it (`context_hash`: every member's name, kind, mode, link target, size and
bytes; not times or owners), so the layer's key changes exactly when the files do; building it packs them again
and refuses a tree that no longer hashes the same (`pack_context`), so what is built is what the key names.
Times are no part of the hash: a layer keeps the files' times of the build that made it. Nothing outside the
templates directory is read: a path that leaves it, also through a symlink, is refused; symlinks below it are
packed as links. The tree is held in memory while packed: this is for a template's small files, not payloads.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

__all__ = ["ContextError", "context_hash", "pack_context"]


class ContextError(Exception):
    """A copy layer's path is not usable: outside the templates directory, missing, or changed since loading."""


def _context_path(root: Path, source: str) -> Path:
    """`source` (relative) under `root`, checked to stay inside it once symlinks are resolved."""
    if not source or os.path.isabs(source):
        raise ContextError(f"copy source {source!r}: a path relative to the templates directory")
    path = root / source
    try:
        inside, exists = path.resolve().is_relative_to(root.resolve()), path.exists()
    except (RuntimeError, ValueError, OSError) as exc:  # a symlink loop, a NUL in the name
        raise ContextError(f"copy source {source!r} cannot be read: {exc}") from exc
    if not inside:
        raise ContextError(f"copy source {source!r} is outside the templates directory {root}")
    if not exists:
        raise ContextError(f"copy source {source!r}: no such file or directory under {root}")
    return path


def context_hash(root: Path, source: str) -> str:
    """The SHA-256 of what `source` under `root` holds now, as `pack_context` packs it."""
    return _digest(_pack(root, source))


def pack_context(root: Path, source: str, expected: str) -> bytes:
    """The tar archive the COPY step unpacks: `source` under its own relative name, its symlinks as links.
    ContextError when it no longer hashes to `expected` (edited since the templates were loaded)."""
    packed = _pack(root, source)
    if _digest(packed) != expected:
        raise ContextError(f"copy source {source!r} changed since the templates were loaded: load them again")
    return packed


def _pack(root: Path, source: str) -> bytes:
    top = _context_path(root, source)
    packed = io.BytesIO()
    try:
        with tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as archive:
            archive.add(top, arcname=source, recursive=True)
    except (RuntimeError, ValueError, OSError) as exc:  # a symlink loop, a name no file system takes, a lost file
        raise ContextError(f"copy source {source!r} cannot be packed: {exc}") from exc
    return packed.getvalue()


def _digest(packed: bytes) -> str:
    digest = hashlib.sha256()
    with tarfile.open(fileobj=io.BytesIO(packed)) as archive:
        for member in archive:
            head = f"{member.name}\0{member.type!r}\0{member.mode:o}\0{member.linkname}\0{member.size}\0"
            digest.update(head.encode("utf-8", "surrogateescape"))
            content = archive.extractfile(member) if member.isfile() else None
            if content is not None:
                digest.update(content.read())  # in memory already: the whole archive is
    return digest.hexdigest()
