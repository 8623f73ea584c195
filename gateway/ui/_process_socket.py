"""A page's WebSocket bridged to a process in the sandbox (envd): the terminal's shell on a PTY, the desktop view's
VNC server on pipes.

The handshake is checked like a state change, before it is accepted: the page's own origin, a live session from
the cookie, and the session's CSRF token in the `csrf` query parameter (a browser WebSocket cannot send headers).
A refused handshake is answered 403 with no detail. The process is killed when the WebSocket closes; while it is
open, its connection keeps the sandbox busy, so the idle policy does not pause it under the user's hands. The
session is checked again every `_SESSION_CHECK` seconds: a sign-out or a revoked key closes the WebSocket and
kills the process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import msgspec
from litestar import WebSocket
from litestar.exceptions import WebSocketDisconnect

from activator import ActivatorError, SandboxRecord
from gateway.ui._auth import COOKIE, CSRF_HEADER, connection_session, live_session
from gateway.ui._context import UiContext
from gateway.ui._envd import AttachedProcess, EnvdError
from gateway.ui._security import csrf_matches, same_origin
from gateway.ui._sessions import Session
from pool import ExecutorError

__all__ = ["Attach", "SignedOut", "finish", "serve_attached"]

_SESSION_CHECK = 1.0  # seconds between two checks that the socket's session is still live
_MAX_REASON = 123  # bytes a close frame's reason may have (RFC 6455)
_encode = msgspec.json.Encoder().encode
OnText = Callable[[AttachedProcess, str], Awaitable[None]]  # a text frame from the page, for the process
Attach = Callable[[SandboxRecord], AbstractAsyncContextManager[AttachedProcess]]


class SignedOut(Exception):
    """The socket's session ended (signed out, expired, or its key revoked)."""


async def serve_attached(
    socket: WebSocket[Any, Any, Any],
    ui: UiContext,
    sandbox_id: str,
    attach: Attach,
    *,
    ended: Callable[[AttachedProcess], str],
    signed_out: str,
    framed: bool = True,
    on_text: OnText | None = None,
) -> None:
    """The whole life of one such WebSocket: the handshake, then the process `attach` starts for the session's
    sandbox, bridged until one side ends; then why it ended (`ended(process)`, `signed_out`, or the error's
    message), sent as `finish` sends it. A sandbox that is gone, kept paused by its user or refused by `attach`
    is accepted and closed at once with the reason, so the page can say why."""
    session = await _accept(socket, ui)
    if session is None:
        return
    try:
        record = ui.services.activator.get(session.owner, sandbox_id)
        async with attach(record) as process:
            await _bridge(socket, process, ui, on_text)
        await finish(socket, {"exit": ended(process)}, framed=framed)
    except SignedOut:
        await finish(socket, {"error": signed_out}, framed=framed)
    except (ActivatorError, EnvdError) as exc:
        await finish(socket, {"error": exc.message}, framed=framed)
    except WebSocketDisconnect:
        pass


async def _accept(socket: WebSocket[Any, Any, Any], ui: UiContext) -> Session | None:
    """The handshake's session, the socket accepted; None when it is refused (closed before accepting: a 403)."""
    session = await connection_session(socket, ui)
    token = socket.query_params.get("csrf") or socket.headers.get(CSRF_HEADER)
    if session is None or not same_origin(socket.headers) or not csrf_matches(session.csrf, token):
        await socket.close(code=4403, reason="refused")
        return None
    await socket.accept()
    return session


async def _bridge(
    socket: WebSocket[Any, Any, Any], process: AttachedProcess, ui: UiContext, on_text: OnText | None
) -> None:
    """Copy bytes both ways (text frames go to `on_text`, or are dropped) until the process exits, the page goes
    away or the session ends (`SignedOut`)."""
    output = asyncio.create_task(_to_page(socket, process))
    given = asyncio.create_task(_to_process(socket, process, on_text))
    watch = asyncio.create_task(_session_ends(ui, socket.cookies.get(COOKIE)))
    done, pending = await asyncio.wait({output, given, watch}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, EnvdError, ActivatorError, ExecutorError):
            await task  # cancelled: how it ended does not matter any more
    for task in done:
        task.result()  # re-raise what ended it (EnvdError is reported to the page; a disconnect ends quietly)


async def finish(socket: WebSocket[Any, Any, Any], message: dict[str, str], *, framed: bool = True) -> None:
    """Tell the page why it ends, as a text frame (`framed`: the page reads frames of its own) and as the close's
    reason (for a client that owns the frames, like noVNC's), and close."""
    reason = next(iter(message.values()), "").encode()[:_MAX_REASON].decode(errors="ignore")
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        if framed:
            await socket.send_text(_encode(message).decode())
        await socket.close(code=1000 if framed else 4000, reason=reason)


async def _session_ends(ui: UiContext, token: str | None) -> None:
    while True:
        await asyncio.sleep(_SESSION_CHECK)
        if await live_session(ui, token) is None:
            raise SignedOut


async def _to_page(socket: WebSocket[Any, Any, Any], process: AttachedProcess) -> None:
    async for chunk in process.output():
        await socket.send_bytes(chunk)


async def _to_process(socket: WebSocket[Any, Any, Any], process: AttachedProcess, on_text: OnText | None) -> None:
    while True:
        message: Mapping[str, Any] = await socket.receive()  # a union of TypedDicts, read as a mapping
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(detail="the page closed the socket")
        if message.get("bytes"):
            await process.write(message["bytes"])
        elif message.get("text") and on_text is not None:
            await on_text(process, message["text"])
