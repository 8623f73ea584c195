"""API-key authentication in front of the MCP transport: a request without a valid key never reaches the MCP layer.

Plain ASGI, so that the refusal is a plain HTTP 401 (with a JSON-RPC error body, which MCP clients surface to
their user as it is), and so that the owner of the key rides in the ASGI scope to the tool handlers, which read it
from the request the SDK hands them.
"""

from __future__ import annotations

from typing import Protocol

import msgspec
from starlette.types import ASGIApp, Receive, Scope, Send

from activator._errors import TooManySignIns

__all__ = ["OWNER", "ApiKeyGate", "KeyVerifier"]

OWNER = "agent_sandbox.owner"  # ASGI scope key: the id of the API key that authenticated the request
_UNAUTHORIZED = -32001  # a JSON-RPC "server error" code (-32000..-32099): the request carries no valid key
_INVALID_REQUEST = -32600


class KeyVerifier(Protocol):
    """What the gate needs of `ApiKeys`."""

    async def check(self, raw: str, client: str | None) -> str | None:
        """The id of the key `raw`, or None if it is not a key; TooManySignIns while `client` failed too often."""
        ...


class ApiKeyGate:
    """Admits POSTs to `/mcp` that carry `Authorization: Bearer <key>` or `X-API-Key: <key>` of a known key (429 +
    Retry-After from an address that failed too many key checks lately: `ApiKeys.check`)."""

    def __init__(self, keys: KeyVerifier, app: ASGIApp) -> None:
        self._keys = keys
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        if scope["path"] not in ("", "/"):  # mounted at /mcp: /mcp/anything is not the endpoint
            await _refuse(send, 404, _INVALID_REQUEST, "not found: the MCP endpoint is /mcp")
            return
        raw = _presented_key(scope)
        try:
            owner = None if raw is None else await self._keys.check(raw, _client(scope))
        except TooManySignIns as exc:
            await _refuse(send, 429, _UNAUTHORIZED, exc.message, retry_after=exc.retry_after)
            return
        if owner is None:
            problem = "invalid API key" if raw else "missing API key"
            await _refuse(send, 401, _UNAUTHORIZED, f"{problem}: send 'Authorization: Bearer <key>' or 'X-API-Key'")
            return
        if scope["method"] == "GET":
            # The stream a GET would open carries server-initiated messages, and these tools send none: 405 lets
            # clients skip it (as the transport spec allows) instead of holding a connection open for nothing.
            await _refuse(send, 405, _INVALID_REQUEST, "this server sends no messages on a GET stream; POST to /mcp")
            return
        await self._app({**scope, OWNER: owner}, receive, send)


def _client(scope: Scope) -> str | None:
    client = scope.get("client")
    return str(client[0]) if client else None


def _presented_key(scope: Scope) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == b"x-api-key" and value.strip():
            return value.decode("latin-1").strip()
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
    return None


async def _refuse(send: Send, status: int, code: int, message: str, *, retry_after: int | None = None) -> None:
    """A JSON-RPC error body, the shape MCP clients read from any failed HTTP answer and show to their user."""
    body = msgspec.json.encode({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="agent-sandbox"'))
    if status == 405:
        headers.append((b"allow", b"POST, DELETE"))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
