"""The ASGI vocabulary of the data plane, and the one place where its failures become responses.

Bodies follow E2B's edge proxy (e2b-protocol §1.5); the SDK classifies the 502s by their message text:

    RoutingError (gateway._routing)            400  the sandbox host or routing headers are malformed
    TrafficRefused (gateway._traffic)          403  private ports: the traffic access token is missing or wrong
    SandboxNotFound                            502  "The sandbox was not found"
    PortNotOpen, ConnectionRefusedError        502  "The sandbox is running but port is not open"
    UpstreamError, any other OSError           502  the sandbox's server is unreachable or broke the exchange
    HoldQueueFull                              503  with Retry-After: 1
    HoldTimeout                                504
    any other ActivatorError                   its status_code
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, NamedTuple

import msgspec

from activator import ActivatorError, HoldQueueFull, PortNotOpen, SandboxNotFound
from gateway._routing import RoutingError
from gateway._traffic import TrafficRefused
from gateway._upstream import UpstreamError

__all__ = ["ASGIApp", "ErrorReply", "Message", "Receive", "Scope", "Send", "error_reply", "send_error"]

# Plain aliases rather than litestar.types: the data plane also passes lifespan scopes through, and the
# proxies build messages that servers accept but litestar's TypedDicts do not describe (e.g. one of text/bytes).
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The exceptions the proxies turn into a reply; anything else is a bug and reaches the server's 500 handler.
REPLIED_ERRORS = (ActivatorError, RoutingError, UpstreamError, OSError)  # OSError includes TimeoutError


class ErrorReply(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class _ErrorBody(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    sandbox_id: str | None = None
    message: str
    code: int


_encode = msgspec.json.Encoder().encode
_NOT_FOUND = "The sandbox was not found"
_PORT_CLOSED = "The sandbox is running but port is not open"


def error_reply(exc: BaseException, sandbox_id: str | None) -> ErrorReply:
    """The response for one of ``REPLIED_ERRORS`` raised while serving a request for ``sandbox_id``."""
    if isinstance(exc, SandboxNotFound):
        return _reply(502, _ErrorBody(sandbox_id=sandbox_id, message=_NOT_FOUND, code=502))
    if isinstance(exc, TrafficRefused):
        return _reply(403, _ErrorBody(sandbox_id=sandbox_id, message=exc.message, code=403))
    if isinstance(exc, PortNotOpen | ConnectionRefusedError):
        return _reply(502, _ErrorBody(sandbox_id=sandbox_id, message=_PORT_CLOSED, code=502))
    if isinstance(exc, ActivatorError | RoutingError):
        extra = [(b"retry-after", b"1")] if isinstance(exc, HoldQueueFull) else []
        return _reply(exc.status_code, _ErrorBody(message=exc.message, code=exc.status_code), extra)
    message = f"The sandbox's server did not answer properly: {exc or type(exc).__name__}"
    return _reply(502, _ErrorBody(sandbox_id=sandbox_id, message=message, code=502))


async def send_error(send: Send, reply: ErrorReply) -> None:
    """Answers an HTTP request with ``reply``."""
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


def _reply(status: int, body: _ErrorBody, extra: list[tuple[bytes, bytes]] | None = None) -> ErrorReply:
    data = _encode(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    return ErrorReply(status, headers + (extra or []), data)
