"""The MCP servers the `mcp-gateway` template has, by the names E2B's `mcp=` configuration uses.

E2B's catalog is Docker's: some 200 servers, nearly all images that call an internet API, plus
`github/<owner>/<repo>` servers cloned from GitHub. Neither can run on a server without internet access,
so a configuration that names one is refused before anything starts, with the list of what runs here:
the reference servers of the Model Context Protocol, from PyPI and npm, installed in the template.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mcp.client.stdio import StdioServerParameters

__all__ = ("AVAILABLE", "BadConfig", "servers")

PREFIX = os.environ.get("MCP_GATEWAY_PREFIX", "/opt/mcp-gateway")
"""Where the template installs the servers: a venv (`bin/`) and npm packages (`npm/bin/`)."""


class BadConfig(Exception):
    """A configuration the gateway refuses; the message is what the SDK shows."""


def _paths(name: str, config: dict[str, Any], *, required: bool) -> list[str]:
    paths = config.get("paths", [])
    if not isinstance(paths, list) or not all(isinstance(path, str) and path.startswith("/") for path in paths):
        raise BadConfig(f"server {name!r}: 'paths' must be a list of absolute paths")
    if required and not paths:
        raise BadConfig(f"server {name!r}: 'paths' must name at least one directory")
    return paths


def _filesystem(config: dict[str, Any]) -> StdioServerParameters:
    return StdioServerParameters(
        command=f"{PREFIX}/npm/bin/mcp-server-filesystem", args=_paths("filesystem", config, required=True)
    )


def _git(config: dict[str, Any]) -> StdioServerParameters:
    paths = _paths("git", config, required=False)
    if len(paths) > 1:
        raise BadConfig("server 'git': one repository path at most ('paths': [\"/home/user/repo\"])")
    return StdioServerParameters(
        command=f"{PREFIX}/bin/mcp-server-git", args=[a for p in paths for a in ("--repository", p)]
    )


def _npm(binary: str, **env: str) -> Callable[[dict[str, Any]], StdioServerParameters]:
    return lambda config: StdioServerParameters(command=f"{PREFIX}/npm/bin/{binary}", env=env or None)


AVAILABLE: dict[str, Callable[[dict[str, Any]], StdioServerParameters]] = {
    "everything": _npm("mcp-server-everything"),
    "filesystem": _filesystem,
    "git": _git,
    "memory": _npm("mcp-server-memory", MEMORY_FILE_PATH="/var/lib/mcp-gateway/memory.jsonl"),
    "sequentialthinking": _npm("mcp-server-sequential-thinking"),
    "time": lambda config: StdioServerParameters(command=f"{PREFIX}/bin/mcp-server-time"),
}
"""Name -> the command that runs it, from its configuration."""


def servers(config: Any) -> dict[str, StdioServerParameters]:
    """The servers a configuration (the JSON of `mcp=`) asks for, or BadConfig."""
    if not isinstance(config, dict) or not config:
        raise BadConfig("the configuration must be a JSON object naming at least one server")
    offered = ", ".join(sorted(AVAILABLE))
    chosen: dict[str, StdioServerParameters] = {}
    for name, settings in config.items():
        if name.startswith("github/"):
            raise BadConfig(
                f"server {name!r} is cloned from GitHub, which this server cannot reach; available here: {offered}"
            )
        if name not in AVAILABLE:
            raise BadConfig(f"server {name!r} is not available on this server; available here: {offered}")
        if not isinstance(settings, dict):
            raise BadConfig(f"server {name!r}: its configuration must be a JSON object")
        chosen[name] = AVAILABLE[name](settings)
    return chosen
