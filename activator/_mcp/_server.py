"""The MCP server at `/mcp`: the official SDK's low-level `Server` over its streamable-HTTP transport.

Stateless: every POST is served on its own (no `Mcp-Session-Id`), so a restart of the server or another gateway
replica loses nothing a client holds, and there is no session state to bound. The SDK negotiates every protocol
version it knows: the initialize handshake of 2024-11-05 through 2025-11-25, and the per-request envelope of
2026-07-28 (`server/discover`). Responses are plain JSON (no SSE stream): the tools send no notifications.
Host/Origin checks (DNS-rebinding protection) are off because every request must carry an API key, which a page
in a browser does not have.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
from contextlib import AbstractAsyncContextManager
from typing import Any

import mcp_types as types
from litestar.handlers import ASGIRouteHandler, asgi
from litestar.types import Receive, Scope, Send
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

from activator._activator import Activator
from activator._errors import ActivatorError, SandboxNotFound
from activator._mcp._errors import ToolError
from activator._mcp._gate import OWNER, ApiKeyGate, KeyVerifier
from activator._mcp._output import Rendered
from activator._mcp._sandbox import SandboxUrls
from activator._mcp._tools import ControlTools

__all__ = ["McpServer"]

_log = logging.getLogger("activator.mcp")

_INSTRUCTIONS = (
    "agent-sandbox runs isolated Linux sandboxes. createSandbox starts one; sandboxExecutor runs its tools "
    "(run_command, write_file, read_file, list_files, get_url, and run_code where there is a code interpreter); "
    "deleteSandbox removes it. A server started in a sandbox with run_command (background: true) is reachable at "
    "the URL get_url returns for its port. To delegate a task to a coding agent working inside a sandbox: "
    "createAgentSession, promptAgentSession with the task, then getAgentSessionEvents from the returned offset "
    "until the turn ended, answering its permission requests with replyAgentPermission."
)
Context = ServerRequestContext[dict[str, Any]]


class McpServer:
    """The `/mcp` endpoint: API-key gate, streamable-HTTP transport, and the tools.

    `run()` must be entered (once) for as long as the app serves: it owns the transport's task group.
    """

    def __init__(self, activator: Activator, keys: KeyVerifier, urls: SandboxUrls) -> None:
        self._tools = ControlTools(activator, urls)
        self._server: Server[dict[str, Any]] = Server(
            "agent-sandbox",
            version=importlib.metadata.version("agent-sandbox"),
            instructions=_INSTRUCTIONS,
            get_tool_input_schema=self._tools.schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._sessions = StreamableHTTPSessionManager(self._server, json_response=True, stateless=True)
        # The transport logs every stateless request at INFO ("Terminating session: None"); keep its warnings only.
        logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)
        self.app = ApiKeyGate(keys, self._sessions.handle_request)

    def run(self) -> AbstractAsyncContextManager[None]:
        """The transport's lifetime: enter it before serving, leave it after (the platform's exit stack)."""
        return self._sessions.run()

    def route(self) -> ASGIRouteHandler:
        """A Litestar handler that mounts the endpoint at `/mcp`."""

        async def mcp_endpoint(scope: Scope, receive: Receive, send: Send) -> None:
            await self.app(scope, receive, send)  # type: ignore[arg-type]  # Litestar's ASGI types are narrower

        return asgi("/mcp", is_mount=True, copy_scope=True)(mcp_endpoint)

    async def _list_tools(self, ctx: Context, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools.listing())

    async def _call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        if not self._tools.knows(params.name):
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        try:
            result = await self._tools.call(_owner(ctx), params.name, params.arguments)
        except SandboxNotFound as exc:
            return _error(f"{exc.message}. listSandbox shows your sandboxes; createSandbox makes a new one.")
        except (ToolError, ActivatorError) as exc:
            return _error(exc.message)
        except Exception:
            _log.exception("MCP tool %s failed", params.name)
            return _error(f"{params.name} failed on the server (the error is in its log); retry, or report it")
        return _result(result)


def _owner(ctx: Context) -> str:
    """The key id the gate put in the scope; the transport passes the request along with every message."""
    owner = ctx.request.scope.get(OWNER) if ctx.request is not None else None
    if not isinstance(owner, str):
        raise MCPError(code=types.INTERNAL_ERROR, message="the request reached the MCP layer without an API key")
    return owner


def _result(result: dict[str, Any] | Rendered) -> types.CallToolResult:
    """The tool's answer as text (and structured content); an `image` entry (a screenshot) as image content. The
    text is the result's JSON, or the rendering a `Rendered` result brings (a session's transcript)."""
    if isinstance(result, Rendered):
        text_content = types.TextContent(text=result.text)
        return types.CallToolResult(content=[text_content], structured_content=result.structured)
    image = result.pop("image", None)
    text = json.dumps(result, ensure_ascii=False, indent=1)
    content: list[types.ContentBlock] = [types.TextContent(text=text)]
    if isinstance(image, dict):
        content.append(types.ImageContent(data=image["data"], mime_type=image["mimeType"]))
    return types.CallToolResult(content=content, structured_content=result)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)
