"""What a sandbox needs of an image's root, checked and completed by reading files, never running the image's.

A sandbox's pid 1 is the executor, started as `/usr/bin/python3 -I -S ...`; its two wheels need glibc; every
step and command runs through `/bin/bash -l -c`; `user` (E2B's default user) is made with the image's
`useradd` in the first build sandbox. So an image must have bash, a Python 3.11 or newer as `python3`, glibc
and `useradd`: Debian, Ubuntu and the official python images have them, Alpine (musl) and distroless do not.

The image is untrusted and this runs as host root, so nothing of it is executed here: versions are read from
file names and the C library's symbol versions, paths resolved inside the root (`resolve_in_root`). Where
`python3` lives elsewhere (the python images keep theirs in /usr/local/bin) a relative symlink makes
`/usr/bin/python3` find it; the few directories a sandbox mounts over are made when missing.
"""

from __future__ import annotations

import os
import platform
import re
import stat
from pathlib import Path

from pool._local._oci_unpack import UnsafeImage, resolve_in_root

__all__ = ["ImageUnfit", "RootFacts", "inspect_root", "prepare_root"]

_PYTHONS = ("usr/bin/python3", "usr/local/bin/python3", "bin/python3")
_BASH = ("bin/bash", "usr/bin/bash")
_USERADD = ("usr/sbin/useradd", "sbin/useradd", "usr/bin/useradd")
# The ELF interpreter glibc programs name, per machine: where the wheels' extension modules expect it.
_LOADERS = {"x86_64": "lib64/ld-linux-x86-64.so.2", "aarch64": "lib/ld-linux-aarch64.so.1"}
_MIN_PYTHON = (3, 11)
_DIRECTORIES = {"tmp": 0o1777, "proc": 0o555, "dev": 0o755, "sys": 0o555, "root": 0o700, "home": 0o755, "etc": 0o755}


class ImageUnfit(Exception):
    """The image lacks what a sandbox needs; the message says what."""


class RootFacts:
    """What the executor layer is built for: the image's Python version and its glibc's."""

    def __init__(self, python: tuple[int, int], glibc: tuple[int, int]) -> None:
        self.python = python
        self.glibc = glibc


def prepare_root(root: Path) -> RootFacts:
    """Check `root` and complete it (blocking): ImageUnfit names everything missing."""
    facts = inspect_root(root)
    for name, mode in _DIRECTORIES.items():
        path = root / name
        if not os.path.lexists(path):
            os.mkdir(path)
            os.chmod(path, mode)
    if _find(root, ("usr/bin/python3",)) is None:
        python = _find(root, _PYTHONS)
        assert python is not None  # inspect_root found one
        usr_bin = resolve_in_root(root, ("usr", "bin"), create=True)
        link = usr_bin / "python3"
        if os.path.lexists(link):
            os.unlink(link)  # a dangling link
        os.symlink(os.path.relpath(root / python, root / "usr/bin"), link)
    return facts


def inspect_root(root: Path) -> RootFacts:
    """What the executor needs of `root`, read without changing it; ImageUnfit when something is missing."""
    missing: list[str] = []
    if _find(root, _BASH) is None:
        missing.append("bash (/bin/bash)")
    if _find(root, _USERADD) is None:
        missing.append("useradd (shadow's passwd package)")
    python = _python_version(root)
    if python is None:
        missing.append("python3 (3.11 or newer)")
    elif python < _MIN_PYTHON:
        missing.append(f"a Python 3.11 or newer (python3 is {python[0]}.{python[1]})")
    glibc = _glibc_version(root)
    if glibc is None:
        missing.append("glibc (musl-based images such as Alpine's cannot run the sandbox's agent)")
    if missing:
        raise ImageUnfit(f"it has no {', no '.join(missing)}")
    assert python is not None
    assert glibc is not None
    return RootFacts(python, glibc)


def _find(root: Path, candidates: tuple[str, ...]) -> str | None:
    """The first candidate that resolves, inside `root`, to an executable regular file."""
    for candidate in candidates:
        resolved = _resolve(root, candidate)
        if resolved is not None:
            st = os.stat(resolved, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111:
                return candidate
    return None


def _resolve(root: Path, relative: str) -> Path | None:
    try:
        path = resolve_in_root(root, relative.split("/"))
        os.lstat(path)
    except (OSError, UnsafeImage):
        return None
    return path


def _python_version(root: Path) -> tuple[int, int] | None:
    found = _find(root, _PYTHONS)
    if found is None:
        return None
    binary = _resolve(root, found)
    assert binary is not None
    match = re.fullmatch(r"python(\d+)\.(\d+)", binary.name)
    if match:
        return int(match[1]), int(match[2])
    # A `python3` that is no link: its version is in the name of its standard library beside it.
    lib = _resolve(root, str(binary.parent.parent.relative_to(root) / "lib"))
    if lib is None:
        return None
    names = [re.fullmatch(r"python(\d+)\.(\d+)", name) for name in _list(lib)]
    versions = sorted((int(m[1]), int(m[2])) for m in names if m and _regular(root, lib, m[0], "os.py"))
    return versions[-1] if versions else None


def _glibc_version(root: Path) -> tuple[int, int] | None:
    loader = _LOADERS.get(platform.machine())
    resolved = _resolve(root, loader) if loader else None
    if resolved is None:
        return None
    libc = _regular(root, resolved.parent, "libc.so.6")
    try:
        content = libc.read_bytes() if libc is not None else b""
    except OSError:
        content = b""
    versions = [(int(m[1]), int(m[2])) for m in re.finditer(rb"GLIBC_(\d+)\.(\d+)", content)]
    return max(versions) if versions else (2, 17)  # an unreadable libc: the oldest manylinux wheels' glibc


def _regular(root: Path, directory: Path, *names: str) -> Path | None:
    """`directory`/`names` (inside `root`) resolved inside `root`, if that is a regular file."""
    path = _resolve(root, "/".join((str(directory.relative_to(root)), *names)))
    if path is None or not stat.S_ISREG(os.lstat(path).st_mode):
        return None
    return path


def _list(directory: Path) -> list[str]:
    try:
        return os.listdir(directory) if stat.S_ISDIR(os.lstat(directory).st_mode) else []
    except OSError:
        return []
