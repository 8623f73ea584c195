"""The terminal: a WebSocket from the page (xterm.js) bridged to a login shell on a PTY in the sandbox (envd).

Frames, page → server: binary = keystrokes (bytes for the PTY); text = `{"cols": C, "rows": R}` (a resize).
Frames, server → page: binary = the PTY's output; text = `{"exit": "<status>"}` or `{"error": "<message>"}`,
then the server closes.

The handshake, the session checks, the shell's end and the reasons sent are `gateway.ui._process_socket`'s.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import WebSocket, websocket

from gateway.ui._context import SandboxIdPath, UiDep
from gateway.ui._envd import AttachedProcess
from gateway.ui._process_socket import serve_attached
from gateway.ui._sandbox_io import envd_for

__all__ = ["terminal"]

_MAX_SIZE = 500  # columns or rows; more is a broken client


class _Resize(msgspec.Struct):
    cols: int
    rows: int


_decode_resize = msgspec.json.Decoder(_Resize).decode


@websocket("/api/sandboxes/{sandbox_id:str}/terminal")
async def terminal(socket: WebSocket[Any, Any, Any], ui: UiDep, sandbox_id: SandboxIdPath) -> None:
    cols, rows = _size(socket, "cols", 80), _size(socket, "rows", 24)
    await serve_attached(
        socket, ui, sandbox_id, lambda record: envd_for(ui, record).pty(cols, rows),
        ended=lambda pty: pty.status or "the shell ended", signed_out="signed out: sign in again to open a terminal",
        on_text=_resize,
    )  # fmt: skip


async def _resize(pty: AttachedProcess, text: str) -> None:
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
