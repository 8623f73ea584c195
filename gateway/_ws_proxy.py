"""The WebSocket reverse proxy from an ASGI ``websocket`` scope to a sandbox port.

The upstream side is the ``websockets`` asyncio client driven by hand on the opener's socket (``connect()``
would follow redirects and look for proxies; a reverse proxy must relay both). The client is accepted only
once the sandbox accepted, with the subprotocol it chose. A refusal is relayed as is (status, headers, body)
when the server supports the ``websocket.http.response`` extension (uvicorn does), else the client is closed
before accept, which servers answer with 403. Messages are relayed whole, text as text and binary as binary.

Closing: a close frame from either side is forwarded with its code and reason (1005, "no code", becomes
1000). A connection that ends without a close frame (1006) ends the other side the same way: the upstream
transport is aborted, or the ASGI app returns without ``websocket.close`` so the server drops the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from websockets.asyncio.client import ClientConnection
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from gateway._errors_response import REPLIED_ERRORS, ErrorReply, Receive, Scope, Send, error_reply
from gateway._http_proxy import RESPONSE_DROP
from gateway._routing import REQUEST_DROP, Route, RoutingError, forwarded_headers, host_header
from gateway._traffic import Forwarding
from gateway._upstream import UpstreamError, UpstreamOpener, connect_upstream

__all__ = ["proxy_websocket"]

_log = logging.getLogger("gateway")

# The handshake headers websockets writes itself (Host comes from the URI), on top of the hop-by-hop ones.
_HANDSHAKE_DROP = REQUEST_DROP | {
    b"host", b"content-length", b"transfer-encoding", b"sec-websocket-key", b"sec-websocket-version",
    b"sec-websocket-extensions", b"sec-websocket-protocol", b"sec-websocket-accept",
}  # fmt: skip
_HANDSHAKE_TIMEOUT = 10.0
_MAX_MESSAGE = 16 * 1024 * 1024  # uvicorn's default --ws-max-size, so both directions have the same limit
_NO_STATUS, _ABNORMAL, _TLS_FAILED = 1005, 1006, 1015


async def proxy_websocket(
    scope: Scope, receive: Receive, send: Send, route: Route, opener: UpstreamOpener,
    forwarding: Forwarding,
) -> None:  # fmt: skip
    """Connects to ``route`` as a WebSocket client (with ``forwarding.host`` as its Host, if given; over TLS to
    an HTTPS port), accepts the client likewise, and relays until either closes."""
    if (await receive())["type"] != "websocket.connect":
        return
    try:
        upstream = await _connect(scope, route, opener, forwarding)
    except InvalidStatus as exc:
        await reject_websocket(scope, send, _refusal(exc.response))
        return
    except (*REPLIED_ERRORS, InvalidHandshake, InvalidURI) as exc:
        _log.info("websocket to port %d of sandbox %s refused: %r", route.port, route.sandbox_id, exc)
        await reject_websocket(scope, send, error_reply(_translate(exc), route.sandbox_id))
        return
    try:
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await _relay(receive, send, upstream, lambda: opener.touch(route.sandbox_id))
    finally:
        upstream.transport.abort()  # a no-op after a clean close


def _refusal(response: Response) -> ErrorReply:
    """The sandbox's own refusal, minus the headers that described its connection."""
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.headers.raw_items()
    ]
    kept = [header for header in headers if header[0] not in RESPONSE_DROP]
    return ErrorReply(response.status_code, kept, bytes(response.body or b""))


def _translate(exc: Exception) -> Exception:
    if isinstance(exc, InvalidURI):
        return RoutingError(f"Invalid Host or path for a WebSocket: {exc}")
    if isinstance(exc, InvalidHandshake):
        return UpstreamError(f"invalid WebSocket handshake ({exc})")
    return exc


async def reject_websocket(scope: Scope, send: Send, reply: ErrorReply) -> None:
    """Refuses the handshake with ``reply``, or with a plain close (403) when the server cannot send a response."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": reply.status, "headers": reply.headers})
        await send({"type": "websocket.http.response.body", "body": reply.body, "more_body": False})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": ""})


async def _connect(scope: Scope, route: Route, opener: UpstreamOpener, forwarding: Forwarding) -> ClientConnection:
    host = forwarding.host or host_header(scope["headers"]) or b"localhost"
    target = scope.get("raw_path") or scope["path"].encode()
    query = b"?" + scope["query_string"] if scope["query_string"] else b""
    protocol = ClientProtocol(
        parse_uri(f"ws://{host.decode('latin-1')}{(target + query).decode('latin-1')}"),
        subprotocols=[Subprotocol(name) for name in scope["subprotocols"]] if scope.get("subprotocols") else None,
        max_size=_MAX_MESSAGE,
    )
    # Pings only probe the loopback/pod hop and would fail while a sandbox is paused; the client side pings.
    upstream = await connect_upstream(
        opener, route, lambda: ClientConnection(protocol, ping_interval=None, close_timeout=_HANDSHAKE_TIMEOUT),
        tls=forwarding.tls, host=forwarding.host,
    )  # fmt: skip
    headers = [
        (name.decode("latin-1"), value.decode("latin-1")) for name, value in forwarded_headers(scope, _HANDSHAKE_DROP)
    ]
    try:
        async with asyncio.timeout(_HANDSHAKE_TIMEOUT):
            await upstream.handshake(headers, user_agent_header=None)
    except BaseException:
        upstream.transport.abort()
        raise
    return upstream


async def _relay(receive: Receive, send: Send, upstream: ClientConnection, touch: Callable[[], None]) -> None:
    to_client = asyncio.create_task(_to_client(upstream, send, touch))
    to_upstream = asyncio.create_task(_to_upstream(receive, upstream, touch))
    try:
        done, _ = await asyncio.wait((to_client, to_upstream), return_when=asyncio.FIRST_COMPLETED)
        if to_client in done:
            to_upstream.cancel()  # the upstream is closed: nothing the client sends can reach it any more
        else:
            to_upstream.result()  # raises what went wrong, if anything did
        await to_client  # once the client went away, this ends as soon as the upstream has closed
    finally:
        to_client.cancel()
        to_upstream.cancel()


async def _to_client(upstream: ClientConnection, send: Send, touch: Callable[[], None]) -> None:
    try:
        async for data in upstream:
            touch()
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})
    except ConnectionClosed:
        pass  # closed with a code other than 1000/1001, or without a close frame
    except OSError:
        return  # the client is gone (uvicorn's ClientDisconnected); the caller closes the upstream
    close = upstream.protocol.close_rcvd
    if close is None:
        return  # returning without websocket.close makes the server drop the client too
    with contextlib.suppress(OSError):
        await send({"type": "websocket.close", "code": _wire_code(close.code), "reason": close.reason})


async def _to_upstream(receive: Receive, upstream: ClientConnection, touch: Callable[[], None]) -> None:
    try:
        message = await receive()
        while message["type"] == "websocket.receive":
            touch()
            text = message.get("text")
            await upstream.send((message.get("bytes") or b"") if text is None else text)
            message = await receive()
    except ConnectionClosed:
        return  # the upstream closed; _to_client forwards its close
    code = message.get("code", 1000)
    if code in (_ABNORMAL, _TLS_FAILED):
        upstream.transport.abort()
    else:
        await upstream.close(_wire_code(code), message.get("reason") or "")


def _wire_code(code: int) -> int:
    """1005 means "the close frame had no code"; the way to say that again is a plain normal closure."""
    return 1000 if code == _NO_STATUS else code
