"""Paths as envd understands them: relative to the user's home, `~` expanded, parents created.

The paths are plain paths of the sandbox's own filesystem: `..` is allowed and resolves as usual
(`/home/user/../../etc/passwd` is `/etc/passwd`); the sandbox boundary, not this module, is what
keeps callers inside the sandbox, and the user's own rights (`_as_user`) what keeps them out of
what that user may not touch.
"""

from __future__ import annotations

import os

from executor._errors import InvalidArgument, os_errors
from executor._users import User

__all__ = ("ensure_dirs", "resolve")


def resolve(path: str, user: User, workdir: str | None = None) -> str:
    """An absolute path for `path` as `user` means it (envd's ExpandAndResolve).

    Empty means the default workdir (else home); `~` and `~/x` are the home directory; other
    relative paths are joined to home and normalised; absolute paths are taken as they are.
    """
    if "\x00" in path:
        raise InvalidArgument(f"invalid path {path!r}: contains a NUL byte")
    if not path and workdir:
        path = workdir
    if path.startswith("~"):
        if len(path) > 1 and path[1] != "/":
            raise InvalidArgument(f"cannot expand user-specific home dir in '{path}'")
        path = path[1:].lstrip("/")
    if os.path.isabs(path):
        return path
    return os.path.normpath(os.path.join(user.home, path))


def ensure_dirs(path: str, uid: int, gid: int) -> list[str]:
    """Create `path` and its missing parents, each owned by uid:gid; existing ones are left alone.

    The directories it made, outermost first.
    """
    missing: list[str] = []
    current = path
    while not os.path.isdir(current):
        if os.path.lexists(current):
            raise InvalidArgument(f"path exists and is not a directory: {current}")
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    created: list[str] = []
    for directory in reversed(missing):
        with os_errors(f"error creating directory '{directory}'"):
            try:
                os.mkdir(directory, 0o755)
            except FileExistsError:
                continue  # created meanwhile by someone else
            created.append(directory)
            os.chown(directory, uid, gid)
    return created
