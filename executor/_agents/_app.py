"""Routing for the agent port: which handler answers which request, after the bearer-token check.

    GET  /                                  {"name": "agent-sandbox agent server", "docs": ...} (public)
    GET  /v1/health                         {"status": "ok"}
    GET  /v1/openapi.json                   this API's OpenAPI document
    GET  /v1/agents[/{agent}]               the agents and whether they can run here (`?config=true`: options)
    POST /v1/agents/{agent}/install         npm install of the agent's pinned packages
    /v1/acp[/{server_id}]                   ACP over HTTP (`_acp_routes`)
    /v1/sessions/...                        the universal session API (`_session_routes`)
    /v1/fs/..., /v1/config/..., /v1/processes/..., /v1/desktop/...   (`_fs_routes`, `_config_routes`,
                                            `_process_routes`, `_desktop_routes`)

When the sandbox has an access token (E2B's `secure`), every route but `/` needs exactly
`Authorization: Bearer <token>`, as upstream with `--token`; otherwise the port is open like envd's.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from urllib.parse import unquote

import msgspec

from executor._agents._acp_hub import AcpHub
from executor._agents._acp_routes import AcpRoutes
from executor._agents._catalog import AGENTS, AgentKind
from executor._agents._config_routes import ConfigRoutes
from executor._agents._desktop_routes import DesktopRoutes
from executor._agents._fs_routes import FsRoutes
from executor._agents._http import ApiError, read_json, send_json, send_problem
from executor._agents._install import Installer, InstallFailed
from executor._agents._launch import Launcher
from executor._agents._openapi import document
from executor._agents._process_routes import ProcessRoutes
from executor._agents._session_routes import SessionRoutes
from executor._agents._sessions import Sessions
from executor._as_user import AsUser
from executor._defaults import Defaults
from executor._errors import ExecutorError
from executor._exchange import Request, Response
from executor._processes import ProcessTable
from executor.agent_api import InstallRequest, problem

__all__ = ("AgentApp",)

Handler = Callable[..., Awaitable[None]]
_PARAMETER = re.compile(r"\{(\w+)\}")


def _pattern(template: str) -> re.Pattern[str]:
    return re.compile(_PARAMETER.sub(lambda match: f"(?P<{match.group(1)}>[^/]+)", template) + "$")


class AgentApp:
    """The agent server of one executor."""

    def __init__(
        self, defaults: Defaults, table: ProcessTable, as_user: AsUser, path_env: str, state_dir: str, agents_dir: str
    ) -> None:
        self._defaults = defaults
        launcher = Launcher(defaults, path_env, state_dir, agents_dir)
        self._launcher = launcher
        self._installer = Installer(launcher, table)
        self.hub = AcpHub(table, launcher)
        acp = AcpRoutes(self.hub)
        self.sessions = Sessions(self.hub, state_dir)
        sessions = SessionRoutes(self.sessions)
        fs = FsRoutes(defaults, as_user)
        processes = ProcessRoutes(defaults, table, path_env)
        mcp, skills = ConfigRoutes(defaults, "mcp", "mcpName"), ConfigRoutes(defaults, "skills", "skillName")
        self._desktop = DesktopRoutes()
        table_of_routes: list[tuple[str, dict[str, Handler]]] = [
            ("/", {"GET": self._root}),
            ("/v1/health", {"GET": self._health}),
            ("/v1/openapi.json", {"GET": self._openapi}),
            ("/v1/agents", {"GET": self._agents}),
            ("/v1/agents/{agent}", {"GET": self._agent}),
            ("/v1/agents/{agent}/install", {"POST": self._install}),
            ("/v1/acp", {"GET": acp.list}),
            ("/v1/acp/{server_id}", {"POST": acp.post, "GET": acp.stream, "DELETE": acp.delete}),
            ("/v1/fs/entries", {"GET": fs.entries}),
            ("/v1/fs/file", {"GET": fs.read, "PUT": fs.write}),
            ("/v1/fs/entry", {"DELETE": fs.delete}),
            ("/v1/fs/mkdir", {"POST": fs.mkdir}),
            ("/v1/fs/move", {"POST": fs.move}),
            ("/v1/fs/stat", {"GET": fs.stat}),
            ("/v1/fs/upload-batch", {"POST": fs.upload_batch}),
            ("/v1/config/mcp", {"GET": mcp.get, "PUT": mcp.put, "DELETE": mcp.delete}),
            ("/v1/config/skills", {"GET": skills.get, "PUT": skills.put, "DELETE": skills.delete}),
            ("/v1/processes/config", {"GET": processes.get_config, "POST": processes.set_config}),
            ("/v1/processes/run", {"POST": processes.run}),
            ("/v1/processes", {"GET": processes.list_processes, "POST": processes.create}),
            ("/v1/processes/{process_id}", {"GET": processes.get, "DELETE": processes.delete}),
            ("/v1/processes/{process_id}/stop", {"POST": processes.stop}),
            ("/v1/processes/{process_id}/kill", {"POST": processes.kill}),
            ("/v1/processes/{process_id}/logs", {"GET": processes.logs}),
            ("/v1/processes/{process_id}/input", {"POST": processes.input}),
            ("/v1/processes/{process_id}/terminal/resize", {"POST": processes.resize}),
            ("/v1/processes/{process_id}/terminal/ws", {"GET": processes.terminal}),
            ("/v1/desktop/status", {"GET": self._desktop.status}),
            ("/v1/sessions", {"GET": sessions.list}),
            ("/v1/sessions/{session_id}", {"POST": sessions.create, "GET": sessions.get}),
            ("/v1/sessions/{session_id}/messages", {"POST": sessions.message}),
            ("/v1/sessions/{session_id}/messages/stream", {"POST": sessions.message_stream}),
            ("/v1/sessions/{session_id}/events", {"GET": sessions.events}),
            ("/v1/sessions/{session_id}/events/sse", {"GET": sessions.events_sse}),
            ("/v1/sessions/{session_id}/permissions/{permission_id}/reply", {"POST": sessions.reply_permission}),
            ("/v1/sessions/{session_id}/questions/{question_id}/reply", {"POST": sessions.question}),
            ("/v1/sessions/{session_id}/questions/{question_id}/reject", {"POST": sessions.question}),
            ("/v1/sessions/{session_id}/cancel", {"POST": sessions.cancel}),
            ("/v1/sessions/{session_id}/terminate", {"POST": sessions.terminate}),
        ]
        self.routes = [(path, list(methods)) for path, methods in table_of_routes]
        self._document: bytes | None = None
        self._exact = {path: methods for path, methods in table_of_routes if "{" not in path}
        self._patterns = [(_pattern(path), methods) for path, methods in table_of_routes if "{" in path]

    async def close(self) -> None:
        await self.sessions.close()
        await self.hub.close_all()

    async def handle(self, request: Request, response: Response) -> None:
        try:
            if request.path != "/" and not self._authorized(request):
                raise ApiError("token_invalid", 401, "missing or invalid bearer token")
            handler, parameters = self._route(request)
            await handler(request, response, **parameters)
        except ApiError as exc:
            if not response.started:
                await send_problem(response, exc.problem)
        except ExecutorError as exc:  # envd's path and file rules, raised by the shared helpers
            if not response.started:
                await send_problem(response, problem(_kind(exc.status), exc.status, exc.message))

    def _authorized(self, request: Request) -> bool:
        import hmac

        token = self._defaults.access_token
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        if not given and request.path.endswith("/terminal/ws"):  # a browser's WebSocket cannot set headers
            given = f"Bearer {request.query.get('access_token', '')}"
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    def _route(self, request: Request) -> tuple[Handler, dict[str, str]]:
        methods, parameters = self._exact.get(request.path), {}
        if methods is None:
            for pattern, candidate in self._patterns:
                match = pattern.match(request.path)
                if match is not None:
                    methods, parameters = candidate, {k: unquote(v) for k, v in match.groupdict().items()}
                    break
        if methods is None and request.path.startswith("/v1/desktop/"):
            methods = {method: self._desktop.other for method in ("GET", "POST", "DELETE")}
        if methods is None:
            raise ApiError("invalid_request", 404, "endpoint not found")
        handler = methods.get(request.method)
        if handler is None:
            raise ApiError("invalid_request", 405, f"method {request.method} is not allowed on {request.path}")
        return handler, parameters

    async def _root(self, request: Request, response: Response) -> None:
        await send_json(response, 200, {"name": "agent-sandbox agent server", "docs": "/v1/openapi.json"})

    async def _health(self, request: Request, response: Response) -> None:
        await send_json(response, 200, {"status": "ok"})

    async def _openapi(self, request: Request, response: Response) -> None:
        if self._document is None:
            self._document = msgspec.json.encode(document(self.routes))
        await response.send(200, self._document, "application/json")

    async def _agents(self, request: Request, response: Response) -> None:
        await send_json(response, 200, self._launcher.catalog(_flag(request, "config")))

    def _kind(self, agent: str) -> AgentKind:
        kind = AGENTS.get(agent)
        if kind is None:
            raise ApiError("unsupported_agent", 400, f"unsupported agent: {agent}", agent=agent)
        return kind

    async def _install(self, request: Request, response: Response, agent: str) -> None:
        kind = self._kind(agent)
        body = await read_json(request, InstallRequest)
        try:
            installed = await self._installer.install(kind, body)
        except ValueError as exc:
            raise ApiError("invalid_request", 400, str(exc), agent=agent) from exc
        except InstallFailed as exc:
            raise ApiError("install_failed", 500, str(exc), agent=agent, details={"stderr": exc.stderr}) from exc
        await send_json(response, 200, installed)

    async def _agent(self, request: Request, response: Response, agent: str) -> None:
        self._kind(agent)
        listing = self._launcher.catalog(_flag(request, "config"))
        await send_json(response, 200, next(info for info in listing.agents if info.id == agent))


_KINDS = {
    401: "token_invalid", 403: "permission_denied", 404: "not_found", 409: "conflict", 413: "payload_too_large",
    501: "not_implemented", 504: "timeout",
}  # fmt: skip


def _kind(status: int) -> str:
    """The error kind of an envd-rules error (raised by the helpers the agent routes share with envd)."""
    return _KINDS.get(status, "invalid_request" if status < 500 else "internal_error")


def _flag(request: Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("1", "true", "yes")
