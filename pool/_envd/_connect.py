"""Connect as envd speaks it (e2b-protocol.md §3): unary JSON calls, and server streams of envelopes (a 5-byte
header: flags, big-endian length; then a JSON message) read envelope by envelope as they arrive.

A refused unary call, or a stream refused before it started, is raised as `ExecutorRefused`.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Mapping

import msgspec

from pool._envd._http1 import Connection, Response
from pool._errors import ExecutorRefused

__all__ = [
    "END_STREAM",
    "STREAM_HEADERS",
    "ConnectError",
    "call_unary",
    "decode_error",
    "envelope",
    "envelopes",
    "trailer_error",
]

END_STREAM = 0x02  # envelope flag: the trailer follows, with an error or nothing
STREAM_HEADERS = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
_UNARY_HEADERS = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}


class ConnectError(msgspec.Struct):
    """A Connect error: of a unary call's body, or in a stream's trailer."""

    code: str | int = "unknown"  # a Connect error code ("deadline_exceeded", "not_found", ...); /files sends 404
    message: str = ""


class _Trailer(msgspec.Struct):
    error: ConnectError | None = None


_encode = msgspec.json.Encoder().encode
_decode_error = msgspec.json.Decoder(ConnectError).decode
_decode_trailer = msgspec.json.Decoder(_Trailer).decode


def envelope(message: bytes) -> bytes:
    """One message framed as a Connect envelope (no flags)."""
    return struct.pack(">BI", 0, len(message)) + message


def decode_error(raw: bytes) -> ConnectError:
    """The error of a unary call's body (`{"code": "...", "message": "..."}`), whatever the body is."""
    try:
        return _decode_error(raw)
    except msgspec.DecodeError:
        return ConnectError("unknown", raw[:200].decode(errors="replace"))


def trailer_error(payload: bytes) -> ConnectError | None:
    """The error a stream's end-of-stream envelope carries, or None when the stream ended cleanly."""
    try:
        return _decode_trailer(payload).error
    except msgspec.DecodeError:
        return ConnectError("unknown", payload[:200].decode(errors="replace"))


async def envelopes(response: Response) -> AsyncIterator[tuple[int, bytes]]:
    """The (flags, payload) of each envelope of a streaming response, as each one completes."""
    if response.status != 200:
        error = decode_error(await response.prefix(4096))
        raise ExecutorRefused(error.code, error.message)
    buffer = bytearray()
    async for chunk in response.chunks():
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = struct.unpack_from(">BI", buffer)
            if len(buffer) < 5 + size:
                break
            yield flags, bytes(buffer[5 : 5 + size])
            del buffer[: 5 + size]


async def call_unary(conn: Connection, method: str, request: object, headers: Mapping[str, str]) -> bytes:
    """One unary call on `conn` (`/filesystem.Filesystem/ListDir`, ...): the JSON answer, or ExecutorRefused."""
    response = await conn.request("POST", method, {**headers, **_UNARY_HEADERS}, _encode(request))
    raw = await response.read()
    if response.status != 200:
        error = decode_error(raw)
        raise ExecutorRefused(error.code, error.message)
    return raw
