"""Reading Connect's envelopes (framed as `executor.envd` defines them) from a request body.

Request bodies of streaming calls are read envelope by envelope as they arrive and decoded with
the method's msgspec decoder; compressed or end-of-stream flags from a client are refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypeVar

import msgspec

from executor._errors import InvalidArgument, PayloadTooLarge, Unimplemented
from executor._exchange import Body
from executor.envd import COMPRESSED, END_STREAM, ENVELOPE_HEADER, MAX_MESSAGE_BYTES, Message

__all__ = ("decode", "read_messages", "read_single_message")

Req = TypeVar("Req", bound=Message)


def decode(message_decoder: msgspec.json.Decoder[Req], payload: bytes, what: str = "request") -> Req:
    """The message, or InvalidArgument: also for JSON nested past the interpreter's recursion limit (about 1,000
    levels), which msgspec reports as RecursionError, not as a decode error."""
    try:
        return message_decoder.decode(payload)
    except msgspec.MsgspecError as exc:
        raise InvalidArgument(f"invalid {what} message: {exc}") from exc
    except RecursionError as exc:
        raise InvalidArgument(f"invalid {what} message: JSON nested too deeply") from exc


async def _payloads(body: Body) -> AsyncIterator[bytes]:
    """The payloads of the enveloped messages of a streaming request body, as they complete."""
    buffer = bytearray()
    async for chunk in body.chunks():
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = ENVELOPE_HEADER.unpack_from(buffer)
            if size > MAX_MESSAGE_BYTES:
                raise PayloadTooLarge(f"message of {size} bytes is over the {MAX_MESSAGE_BYTES} byte limit")
            if len(buffer) < 5 + size:
                break
            if flags & COMPRESSED:
                raise Unimplemented("compressed messages are not supported")
            if flags & END_STREAM:
                raise InvalidArgument("a request stream must not carry an end-of-stream message")
            yield bytes(buffer[5 : 5 + size])
            del buffer[: 5 + size]
    if buffer:
        raise InvalidArgument("request body ends inside an envelope")


async def read_messages(body: Body, message_decoder: msgspec.json.Decoder[Req]) -> AsyncIterator[Req]:
    async for payload in _payloads(body):
        yield decode(message_decoder, payload)


async def read_single_message(body: Body, message_decoder: msgspec.json.Decoder[Req]) -> Req:
    messages = [message async for message in read_messages(body, message_decoder)]
    if len(messages) != 1:
        raise InvalidArgument(f"expected exactly one request message, got {len(messages)}")
    return messages[0]
