"""The server side of a WebSocket (RFC 6455) over a connection `Response.upgrade()` took over.

Written here rather than imported because the executor imports only msgspec and httptools (it runs on
the sandbox image's own Python with nothing else installed). It does what a terminal needs: text and
binary messages (fragmented ones joined), ping answered with pong, the close handshake; client
frames must be masked, a message is at most `MAX_MESSAGE_BYTES`, and anything else closes the
connection with the status the RFC names.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

from executor._exchange import Body, Request

__all__ = ("BINARY", "MAX_MESSAGE_BYTES", "TEXT", "Closed", "WebSocket", "accept_key", "is_upgrade")

TEXT, BINARY, CLOSE, PING, PONG, CONTINUATION = 0x1, 0x2, 0x8, 0x9, 0xA, 0x0
MAX_MESSAGE_BYTES = 1024 * 1024
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PROTOCOL_ERROR, TOO_BIG, NORMAL = 1002, 1009, 1000

WriteRaw = Callable[[bytes], Awaitable[None]]
"""Writes bytes to the connection and waits while it is full."""


class Closed(Exception):
    """The peer closed the WebSocket, or broke the protocol (we closed it then)."""


def is_upgrade(request: Request) -> bool:
    """Whether the request asks for a WebSocket (RFC 6455 §4.2.1)."""
    headers = request.headers
    return (
        request.method == "GET"
        and headers.get("upgrade", "").lower() == "websocket"
        and "upgrade" in headers.get("connection", "").lower()
        and headers.get("sec-websocket-version") == "13"
        and bool(headers.get("sec-websocket-key"))
    )


def accept_key(key: str) -> str:
    """`Sec-WebSocket-Accept` for the client's `Sec-WebSocket-Key`."""
    return base64.b64encode(hashlib.sha1(key.encode("latin-1") + _GUID).digest()).decode()


class WebSocket:
    """One accepted WebSocket: `receive()` messages, `send_text` / `send_binary`, `close()`."""

    def __init__(self, stream: Body, write: WriteRaw) -> None:
        self._chunks: AsyncIterator[bytes] = stream.chunks()
        self._buffer = bytearray()
        self._write = write
        self.closed = False

    async def receive(self) -> tuple[int, bytes]:
        """The next whole message, `(TEXT | BINARY, payload)`; Closed once the peer has closed."""
        kind, parts, size = 0, [], 0
        while True:
            fin, opcode, payload = await self._frame()
            if opcode == PING:
                await self._send(PONG, payload)
            elif opcode == PONG:
                continue
            elif opcode == CLOSE:
                await self.close(NORMAL)
                raise Closed("the peer closed the WebSocket")
            elif (opcode == CONTINUATION) != bool(kind):  # a continuation without a start, or a start inside one
                await self.close(PROTOCOL_ERROR)
                raise Closed("a fragmented message out of order")
            else:
                kind = kind or opcode
                size += len(payload)
                if size > MAX_MESSAGE_BYTES:
                    await self.close(TOO_BIG)
                    raise Closed(f"a message larger than {MAX_MESSAGE_BYTES} bytes")
                parts.append(payload)
                if fin:
                    return kind, b"".join(parts)

    async def send_text(self, text: str) -> None:
        await self._send(TEXT, text.encode())

    async def send_binary(self, data: bytes) -> None:
        await self._send(BINARY, data)

    async def close(self, code: int = NORMAL) -> None:
        """Send a close frame (once); the connection ends when the handler returns."""
        if not self.closed:
            self.closed = True
            await self._send(CLOSE, struct.pack("!H", code), force=True)

    async def _send(self, opcode: int, payload: bytes, force: bool = False) -> None:
        if self.closed and not force:
            raise Closed("the WebSocket is closed")
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        await self._write(head + payload)

    async def _read(self, count: int) -> bytes:
        while len(self._buffer) < count:
            try:
                self._buffer += await anext(self._chunks)
            except (StopAsyncIteration, ConnectionError):
                self.closed = True
                raise Closed("the connection ended") from None
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    async def _frame(self) -> tuple[bool, int, bytes]:
        first, second = await self._read(2)
        fin, opcode, masked, size = bool(first & 0x80), first & 0x0F, bool(second & 0x80), second & 0x7F
        if first & 0x70 or not masked or opcode not in (TEXT, BINARY, CLOSE, PING, PONG, CONTINUATION):
            await self.close(PROTOCOL_ERROR)  # reserved bits, an unmasked client frame, an unknown opcode
            raise Closed("a frame breaking RFC 6455")
        if size == 126:
            (size,) = struct.unpack("!H", await self._read(2))
        elif size == 127:
            (size,) = struct.unpack("!Q", await self._read(8))
        if size > MAX_MESSAGE_BYTES or (opcode >= CLOSE and (size > 125 or not fin)):
            await self.close(TOO_BIG if size > MAX_MESSAGE_BYTES else PROTOCOL_ERROR)
            raise Closed("a frame too large")
        mask = await self._read(4)
        masked_payload = await self._read(size)
        key = (mask * (size // 4 + 1))[:size]  # unmasked as two big integers: C speed, not a loop per byte
        payload = (int.from_bytes(masked_payload, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")
        return fin, opcode, payload
