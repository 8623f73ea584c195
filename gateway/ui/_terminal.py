"""The terminal: a WebSocket from the page (xterm.js) bridged to a login shell on a PTY in the sandbox (envd).

Frames, page → server: binary = keystrokes (bytes for the PTY); text = `{"cols": C, "rows": R}` (a resize).
Frames, server → page: binary = the PTY's output; text = `{"exit": "<status>"}` or `{"error": "<message>"}`,
then the server closes.

The handshake is checked like a state change, before it is accepted: the page's own origin, a live session from
the cookie, and the session's CSRF token in the `csrf` query parameter (a browser WebSocket cannot send headers).
A refused handshake is answered 403 with no detail. A sandbox that is gone or kept paused by its user is accepted
and closed at once with the reason, so the page can say why. The shell is killed when the WebSocket closes; while
it is open, its connection keeps the sandbox busy, so the idle policy does not pause it under the user's hands.
The session is checked again every `_SESSION_CHECK` seconds: a sign-out or a revoked key closes the terminal and
kills its shell.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping
from typing import Any

import msgspec
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect

from activator import ActivatorError
from gateway.ui._auth import COOKIE, CSRF_HEADER, connection_session, live_session
from gateway.ui._context import SandboxIdPath, UiContext, UiDep
from gateway.ui._envd import EnvdError, Pty
from gateway.ui._sandbox_io import envd_for
from gateway.ui._security import csrf_matches, same_origin
from pool import ExecutorError

__all__ = ["terminal"]

_MAX_SIZE = 500  # columns or rows; more is a broken client
_SESSION_CHECK = 1.0  # seconds between two checks that the terminal's session is still live


class _SignedOut(Exception):
    """The terminal's session ended (signed out, expired, or its key revoked)."""


class _Resize(msgspec.Struct):
    cols: int
    rows: int


_decode_resize = msgspec.json.Decoder(_Resize).decode
_encode = msgspec.json.Encoder().encode


@websocket("/api/sandboxes/{sandbox_id:str}/terminal")
async def terminal(socket: WebSocket[Any, Any, Any], ui: UiDep, sandbox_id: SandboxIdPath) -> None:
    session = await connection_session(socket, ui)
    token = socket.query_params.get("csrf") or socket.headers.get(CSRF_HEADER)
    if session is None or not same_origin(socket.headers) or not csrf_matches(session.csrf, token):
        await socket.close(code=4403, reason="refused")  # before accept: the handshake is answered 403
        return
    await socket.accept()
    try:
        envd = envd_for(ui, ui.services.activator.get(session.owner, sandbox_id))
        async with envd.pty(_size(socket, "cols", 80), _size(socket, "rows", 24)) as pty:
            await _bridge(socket, pty, _session_ends(ui, socket.cookies.get(COOKIE)))
        await _finish(socket, {"exit": pty.status or "the shell ended"})
    except _SignedOut:
        await _finish(socket, {"error": "signed out: sign in again to open a terminal"})
    except (ActivatorError, EnvdError) as exc:
        await _finish(socket, {"error": exc.message})
    except WebSocketDisconnect:
        pass


async def _bridge(socket: WebSocket[Any, Any, Any], pty: Pty, session_ends: Coroutine[Any, Any, None]) -> None:
    """Copy both ways until the shell exits, the page goes away or the session ends (`_SignedOut`)."""
    output = asyncio.create_task(_to_page(socket, pty))
    keys = asyncio.create_task(_to_shell(socket, pty))
    watch = asyncio.create_task(session_ends)
    done, pending = await asyncio.wait({output, keys, watch}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect, EnvdError, ActivatorError, ExecutorError):
            await task  # cancelled: how it ended does not matter any more
    for task in done:
        task.result()  # re-raise what ended it (EnvdError is reported to the page; a disconnect ends quietly)


async def _session_ends(ui: UiContext, token: str | None) -> None:
    while True:
        await asyncio.sleep(_SESSION_CHECK)
        if await live_session(ui, token) is None:
            raise _SignedOut


async def _to_page(socket: WebSocket[Any, Any, Any], pty: Pty) -> None:
    async for chunk in pty.output():
        await socket.send_bytes(chunk)


async def _to_shell(socket: WebSocket[Any, Any, Any], pty: Pty) -> None:
    while True:
        message: Mapping[str, Any] = await socket.receive()  # a union of TypedDicts, read as a mapping
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(detail="the page closed the terminal")
        if message.get("bytes"):
            await pty.write(message["bytes"])
        elif message.get("text"):
            try:
                size = _decode_resize(message["text"])
            except msgspec.DecodeError:
                continue  # not a resize: ignored, like a terminal ignores an unknown escape
            await pty.resize(_clamp(size.cols), _clamp(size.rows))


async def _finish(socket: WebSocket[Any, Any, Any], message: dict[str, str]) -> None:
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        await socket.send_text(_encode(message).decode())
        await socket.close(code=1000)


def _size(socket: WebSocket[Any, Any, Any], name: str, default: int) -> int:
    value = socket.query_params.get(name, "")
    return _clamp(int(value)) if value.isdigit() else default


def _clamp(value: int) -> int:
    return max(1, min(value, _MAX_SIZE))
