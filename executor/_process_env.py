"""The environment and working directory of a process the executor starts (envd's rules), for every starter."""

from __future__ import annotations

import os

from executor._defaults import Defaults
from executor._errors import InvalidArgument
from executor._paths import resolve
from executor._users import User

__all__ = ("environment", "working_directory")


def environment(defaults: Defaults, path_env: str, user: User, requested: dict[str, str]) -> dict[str, str]:
    """envd's order: PATH and the user's variables, then the sandbox's (/init), then the request's."""
    env = {"PATH": path_env, "HOME": user.home, "USER": user.name, "LOGNAME": user.name}
    return env | {"SHELL": user.shell} | defaults.env_vars | requested


def working_directory(defaults: Defaults, user: User, requested: str | None) -> str:
    """The requested directory (relative to the user's home), else the sandbox's workdir or the home."""
    cwd = resolve(requested or "", user, defaults.workdir)
    if os.path.isdir(cwd):
        return cwd
    if requested:
        raise InvalidArgument(f"cwd '{cwd}' does not exist")
    return "/"  # none asked for and the user has no home (e.g. nobody): envd would fail here
