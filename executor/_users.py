"""Linux users: who an RPC or file operation runs as.

RPCs name their user with `Authorization: Basic base64("<name>:")` (empty password), `/files` with
the `username` query parameter; without either, the sandbox's default user applies (`--default-user`
or `defaultUser` from /init). Unknown users are `Unauthenticated` ("invalid username"), as in envd.

`--home DIR` replaces every user's home directory (HOME of its processes, the base of relative paths): the
dev cluster's pods run on the host and share its accounts, and each must have a home of its own, as a
container does, rather than the host's /root with its shell profile.
"""

from __future__ import annotations

import binascii
import functools
import os
import pwd
from base64 import b64decode
from dataclasses import dataclass

from executor._errors import Unauthenticated

__all__ = ("User", "from_authorization", "lookup", "override_home")

_home_override: list[str] = []  # set once at start by `override_home`, before any request


def override_home(directory: str) -> None:
    """Make `directory` every user's home (the executor's `--home`)."""
    _home_override[:] = [directory]


@dataclass(frozen=True)
class User:
    """An account from /etc/passwd."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str

    def groups(self) -> list[int]:
        """Supplementary group ids, from /etc/group."""
        return os.getgrouplist(self.name, self.gid)

    def extra_groups(self) -> list[int] | None:
        """`groups()` for `subprocess.Popen(extra_groups=)`; None where setgroups() is not allowed."""
        return self.groups() if _can_set_groups() else None


@functools.cache
def _can_set_groups() -> bool:
    """Whether setgroups() is allowed here (it is not in some user namespaces, nor for non-root)."""
    try:
        os.setgroups(os.getgroups())
    except PermissionError:
        return False
    return True


def lookup(name: str) -> User:
    """The user called `name`, or Unauthenticated."""
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise Unauthenticated(f"invalid username: '{name}'") from exc
    home = _home_override[0] if _home_override else entry.pw_dir or "/"
    return User(entry.pw_name, entry.pw_uid, entry.pw_gid, home, entry.pw_shell or "/bin/sh")


def from_authorization(header: str | None, default: str) -> User:
    """The user named by an `Authorization: Basic` header, else the default user."""
    if not header:
        return lookup(default)
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() != "basic":
        raise Unauthenticated(f"unsupported authorization scheme '{scheme}': expected Basic")
    try:
        decoded = b64decode(credentials.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise Unauthenticated("invalid Basic authorization header") from exc
    name = decoded.partition(":")[0]
    return lookup(name) if name else lookup(default)
