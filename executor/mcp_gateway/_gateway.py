"""The gateway: the configured stdio MCP servers as one streamable-HTTP MCP server, behind a bearer token.

Each server is started once, as a child over stdio (the official SDK's client), and its tools are listed
then; the gateway lists their union and passes each call to the server that has the tool. A tool name two
servers share is offered as `<server>_<tool>` for the later server. Requests are stateless (no session to
keep) and answered as JSON, as the control plane's own `/mcp` is.
"""

from __future__ import annotations

import hmac
import json
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

__all__ = ("Gateway", "Route")

logger = logging.getLogger("mcp-gateway")


@dataclass(frozen=True)
class Route:
    """Where one of the gateway's tools is: the server's client and the tool's name there."""

    client: Client
    name: str


class Gateway:
    """Enter `serving()` to start the servers and the transport; `app` is the ASGI endpoint."""

    def __init__(self, servers: dict[str, StdioServerParameters], token: str) -> None:
        self._servers = servers
        self._token = token.encode()
        self._tools: list[types.Tool] = []
        self._routes: dict[str, Route] = {}
        self._server: Server[Any] = Server("mcp-gateway", on_list_tools=self._list, on_call_tool=self._call)
        self._sessions = StreamableHTTPSessionManager(self._server, json_response=True, stateless=True)
        logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)

    async def start(self, stack: AsyncExitStack) -> None:
        """Start every server and learn its tools (a server that fails to start fails the gateway)."""
        for name, parameters in self._servers.items():
            try:
                client = await stack.enter_async_context(Client(parameters))
                listed = await client.list_tools()
            except Exception as exc:
                raise RuntimeError(f"server {name!r} did not start: {exc}") from exc
            for tool in listed.tools:
                public = tool.name if tool.name not in self._routes else f"{name}_{tool.name}"
                self._routes[public] = Route(client, tool.name)
                self._tools.append(tool.model_copy(update={"name": public}))
            logger.info("server %s: %d tools", name, len(listed.tools))
        await stack.enter_async_context(self._sessions.run())

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != "/mcp":
            return await _answer(send, 404, "not found: the gateway serves /mcp")
        headers = dict(scope.get("headers") or [])
        scheme, _, supplied = headers.get(b"authorization", b"").strip().partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(supplied.strip(), self._token):
            return await _answer(send, 401, "the gateway needs 'Authorization: Bearer <the sandbox's MCP token>'")
        await self._sessions.handle_request(scope, receive, send)

    async def _list(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        return types.ListToolsResult(tools=self._tools)

    async def _call(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        route = self._routes.get(params.name)
        if route is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        return await route.client.call_tool(route.name, params.arguments)


async def _answer(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
