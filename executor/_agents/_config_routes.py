"""`/v1/config/mcp` and `/v1/config/skills`: named entries of `<directory>/.sandbox-agent/config/{mcp,skills}.json`.

    GET    ?directory&mcpName|skillName   the entry; a missing one is 404 `session_not_found` "mcp:<name>" (upstream's)
    PUT    (same query) JSON body         204: stored under its name
    DELETE (same query)                   204

Upstream's layout, so that agents and tools reading those files find them. The file belongs to the
sandbox's default user; at most `MAX_CONFIG_BYTES` per entry.
"""

from __future__ import annotations

import json
import os
from typing import Any

from executor._agents._http import ApiError, read_json, send_json
from executor._defaults import Defaults
from executor._errors import os_errors
from executor._exchange import Request, Response
from executor._paths import ensure_dirs, resolve
from executor._users import lookup

__all__ = ("ConfigRoutes",)

MAX_CONFIG_BYTES = 256 * 1024


class ConfigRoutes:
    """One of the two config kinds: `kind` is "mcp" or "skills", its entries named by `?<name_parameter>`."""

    def __init__(self, defaults: Defaults, kind: str, name_parameter: str) -> None:
        self._defaults = defaults
        self._kind = kind
        self._name = name_parameter

    def _where(self, request: Request) -> tuple[str, str]:
        for parameter in ("directory", self._name):
            if not request.query.get(parameter):
                raise ApiError("invalid_request", 400, f"missing required query parameter '{parameter}'")
        user = lookup(self._defaults.user)
        directory = resolve(request.query["directory"], user, None)
        return os.path.join(directory, ".sandbox-agent", "config", f"{self._kind}.json"), request.query[self._name]

    def _load(self, path: str) -> dict[str, Any]:
        try:
            with open(path) as file:
                loaded = json.load(file)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ApiError("invalid_request", 400, f"{path} cannot be read: {exc}") from exc
        return loaded if isinstance(loaded, dict) else {}

    async def get(self, request: Request, response: Response) -> None:
        path, name = self._where(request)
        entries = self._load(path)
        if name not in entries:
            raise ApiError(
                "session_not_found", 404, f"session not found: {self._kind}:{name}", sessionId=f"{self._kind}:{name}"
            )
        await send_json(response, 200, entries[name])

    async def put(self, request: Request, response: Response) -> None:
        path, name = self._where(request)
        value = await read_json(request)
        if not isinstance(value, dict):
            raise ApiError("invalid_request", 400, f"the {self._kind} config must be a JSON object")
        if len(json.dumps(value)) > MAX_CONFIG_BYTES:
            raise ApiError("payload_too_large", 413, f"a {self._kind} entry may be at most {MAX_CONFIG_BYTES} bytes")
        entries = self._load(path) | {name: value}
        self._store(path, entries)
        await response.send(204)

    async def delete(self, request: Request, response: Response) -> None:
        path, name = self._where(request)
        entries = self._load(path)
        if entries.pop(name, None) is not None:
            self._store(path, entries)
        await response.send(204)

    def _store(self, path: str, entries: dict[str, Any]) -> None:
        user = lookup(self._defaults.user)
        ensure_dirs(os.path.dirname(path), user.uid, user.gid)
        temporary = f"{path}.tmp"
        with os_errors(f"error writing '{path}'"):
            with open(temporary, "w") as file:
                json.dump(entries, file, indent=2)
            os.chown(temporary, user.uid, user.gid)
            os.replace(temporary, path)
