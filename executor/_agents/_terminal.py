"""`GET /v1/processes/{id}/terminal/ws`: a process's terminal over a WebSocket, as sandbox-agent 0.4.2 frames it.

    server → client   text {"type":"ready","processId"} first; binary frames of output (what the process
                      printed before the connection, then live); text {"type":"exit","exitCode"} and a
                      close once it has exited; text {"type":"error","message"} for a frame it cannot use
    client → server   text {"type":"input","data","encoding"?: "utf8" (default) | "base64"},
                      {"type":"resize","cols","rows"}, {"type":"close"}; a binary frame is input as it is

The SDK sends the token as `?access_token=` (browsers cannot set headers on a WebSocket); `AgentApp`
accepts it on this route only. Input goes to the PTY when the process has one, else to its stdin.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from typing import Any

from executor._agents._http import ApiError
from executor._agents._process_routes import Tracked
from executor._exchange import Request, Response
from executor._websocket import BINARY, Closed, WebSocket, accept_key, is_upgrade

__all__ = ("serve_terminal",)


async def serve_terminal(request: Request, response: Response, tracked: Tracked) -> None:
    """Run the WebSocket until the process exits or the client leaves."""
    if not is_upgrade(request):
        raise ApiError("invalid_request", 400, "this route is a WebSocket: connect with Upgrade: websocket")
    stream = await response.upgrade(
        (
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-accept", accept_key(request.headers["sec-websocket-key"])),
        )
    )
    socket = WebSocket(stream, response.write_raw)
    await socket.send_text(json.dumps({"type": "ready", "processId": tracked.info.id}))
    loop = asyncio.get_running_loop()
    sides = {loop.create_task(_send_output(socket, tracked)), loop.create_task(_read_client(socket, tracked))}
    try:
        await asyncio.wait(sides, return_when=asyncio.FIRST_COMPLETED)  # the exit, or the client gone
    finally:
        for side in sides:
            side.cancel()
        await asyncio.gather(*sides, return_exceptions=True)
        with contextlib.suppress(Closed, ConnectionError):
            await socket.close()


async def _send_output(socket: WebSocket, tracked: Tracked) -> None:
    seen = 0
    while True:
        upto = tracked.last_sequence
        for sequence, _, _, data in tracked.entries:
            if seen < sequence <= upto:
                await socket.send_binary(data)
        seen = upto
        if tracked.done.is_set() and tracked.last_sequence == seen:
            await socket.send_text(json.dumps({"type": "exit", "exitCode": tracked.info.exit_code}))
            return
        await tracked.wait(seen)


async def _read_client(socket: WebSocket, tracked: Tracked) -> None:
    """Apply the client's frames until it closes; a bad one gets an error frame and is skipped."""
    while True:
        kind, payload = await socket.receive()
        try:
            if kind == BINARY:
                await _input(tracked, payload)
                continue
            frame = json.loads(payload)
            if not isinstance(frame, dict):
                raise ValueError("a frame must be a JSON object")
            if frame.get("type") == "close":
                await socket.close()
                return
            await _apply(tracked, frame)
        except (ValueError, ApiError) as exc:
            message = exc.problem.detail if isinstance(exc, ApiError) else str(exc)
            await socket.send_text(json.dumps({"type": "error", "message": message}))


async def _apply(tracked: Tracked, frame: dict[str, Any]) -> None:
    kind = frame.get("type")
    if kind == "input":
        data = frame.get("data")
        if not isinstance(data, str):
            raise ValueError("input needs a string 'data'")
        if frame.get("encoding") == "base64":
            try:
                await _input(tracked, base64.b64decode(data, validate=True))
            except binascii.Error as exc:
                raise ValueError("invalid base64 input") from exc
        else:
            await _input(tracked, data.encode())
    elif kind == "resize":
        cols, rows = frame.get("cols"), frame.get("rows")
        if not (isinstance(cols, int) and isinstance(rows, int) and 0 < cols < 65536 and 0 < rows < 65536):
            raise ValueError("resize needs integer cols and rows between 1 and 65535")
        if not tracked.process.has_pty or tracked.info.status != "running":
            raise ValueError("PTY resize handle unavailable")
        tracked.process.resize(cols, rows)
    else:
        raise ValueError(f"unknown frame type {kind!r}: input, resize or close")


async def _input(tracked: Tracked, data: bytes) -> None:
    if tracked.info.status != "running":
        raise ValueError(f"process {tracked.info.id} has exited")
    await tracked.process.write_input(data, to_pty=tracked.process.has_pty)
