"""Reading Connect as envd speaks it (e2b-protocol.md §3; the wire itself is `executor.envd`): the envelopes of a
server stream as each one completes, and the error of a refused call or of a stream's trailer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

from executor.envd import ENVELOPE_HEADER, EndOfStream, ErrorBody
from pool._envd._transport import Reply
from pool._errors import ExecutorRefused

__all__ = ["decode_error", "envelopes", "refused", "trailer_error"]

_decode_error = msgspec.json.Decoder(ErrorBody).decode
_decode_trailer = msgspec.json.Decoder(EndOfStream).decode


def decode_error(raw: bytes, status: int) -> ErrorBody:
    """The error of a refused call's body (`{"code": ..., "message": ...}`), whatever the body is; a body that
    is not one is reported with the HTTP `status` as its code."""
    try:
        return _decode_error(raw)
    except msgspec.DecodeError:
        return ErrorBody(status, raw[:200].decode(errors="replace"))


def trailer_error(payload: bytes) -> ErrorBody | None:
    """The error a stream's end-of-stream envelope carries, or None when the stream ended cleanly."""
    try:
        return _decode_trailer(payload).error
    except msgspec.DecodeError:
        return ErrorBody("unknown", payload[:200].decode(errors="replace"))


async def refused(reply: Reply) -> ExecutorRefused:
    """The error of a call the executor did not answer with 200."""
    error = decode_error(await reply.prefix(4096), reply.status)
    return ExecutorRefused(error.code, error.message)


async def envelopes(reply: Reply) -> AsyncIterator[tuple[int, bytes]]:
    """The (flags, payload) of each envelope of a streaming response, as each one completes."""
    buffer = bytearray()
    async for chunk in reply.chunks():
        buffer += chunk
        while len(buffer) >= ENVELOPE_HEADER.size:
            flags, size = ENVELOPE_HEADER.unpack_from(buffer)
            end = ENVELOPE_HEADER.size + size
            if len(buffer) < end:
                break
            yield flags, bytes(buffer[ENVELOPE_HEADER.size : end])
            del buffer[:end]
