"""Connect's message framing: 5-byte envelopes (flags, big-endian length) around JSON payloads.

Request bodies of streaming calls are read envelope by envelope as they arrive and decoded with
the method's msgspec decoder; compressed or end-of-stream flags from a client are refused.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import TypeVar

import msgspec

from executor._errors import InvalidArgument, PayloadTooLarge, Unimplemented
from executor._exchange import Body
from executor._messages import Message

__all__ = ("END_STREAM", "MAX_MESSAGE_BYTES", "decode", "envelope", "read_messages", "read_single_message")

MAX_MESSAGE_BYTES = 32 * 1024 * 1024
COMPRESSED = 0x01
END_STREAM = 0x02

Req = TypeVar("Req", bound=Message)


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def decode(message_decoder: msgspec.json.Decoder[Req], payload: bytes) -> Req:
    try:
        return message_decoder.decode(payload)
    except msgspec.MsgspecError as exc:
        raise InvalidArgument(f"invalid request message: {exc}") from exc


async def _payloads(body: Body) -> AsyncIterator[bytes]:
    """The payloads of the enveloped messages of a streaming request body, as they complete."""
    buffer = bytearray()
    async for chunk in body.chunks():
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = struct.unpack_from(">BI", buffer)
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
