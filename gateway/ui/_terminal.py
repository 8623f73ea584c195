"""The terminal: a WebSocket from the page (xterm.js) bridged to a login shell on a PTY in the sandbox (envd).

Frames, page → server: binary = keystrokes (bytes for the PTY); text = `{"cols": C, "rows": R}` (a resize).
Frames, server → page: binary = the PTY's output; text = `{"exit": "<status>"}` or `{"error": "<message>"}`,
then the server closes.

The handshake, the session checks and the shell's end are `gateway.ui._process_socket`'s. A sandbox that is gone
or kept paused by its user is accepted and closed at once with the reason, so the page can say why.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import WebSocket, websocket
from litestar.exceptions import WebSocketDisconnect

from activator import ActivatorError
from gateway.ui._context import SandboxIdPath, UiDep
from gateway.ui._envd import EnvdError, Pty
from gateway.ui._process_socket import SignedOut, accept, bridge, finish
from gateway.ui._sandbox_io import envd_for

__all__ = ["terminal"]

_MAX_SIZE = 500  # columns or rows; more is a broken client


class _Resize(msgspec.Struct):
    cols: int
    rows: int


_decode_resize = msgspec.json.Decoder(_Resize).decode


@websocket("/api/sandboxes/{sandbox_id:str}/terminal")
async def terminal(socket: WebSocket[Any, Any, Any], ui: UiDep, sandbox_id: SandboxIdPath) -> None:
    session = await accept(socket, ui)
    if session is None:
        return
    try:
        envd = envd_for(ui, ui.services.activator.get(session.owner, sandbox_id))
        async with envd.pty(_size(socket, "cols", 80), _size(socket, "rows", 24)) as pty:
            await bridge(socket, pty, ui, on_text=lambda text: _resize(pty, text))
        await finish(socket, {"exit": pty.status or "the shell ended"})
    except SignedOut:
        await finish(socket, {"error": "signed out: sign in again to open a terminal"})
    except (ActivatorError, EnvdError) as exc:
        await finish(socket, {"error": exc.message})
    except WebSocketDisconnect:
        pass


async def _resize(pty: Pty, text: str) -> None:
    try:
        size = _decode_resize(text)
    except msgspec.DecodeError:
        return  # not a resize: ignored, like a terminal ignores an unknown escape
    await pty.resize(_clamp(size.cols), _clamp(size.rows))


def _size(socket: WebSocket[Any, Any, Any], name: str, default: int) -> int:
    value = socket.query_params.get(name, "")
    return _clamp(int(value)) if value.isdigit() else default


def _clamp(value: int) -> int:
    return max(1, min(value, _MAX_SIZE))
