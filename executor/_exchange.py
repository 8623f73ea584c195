"""Requests and responses as handlers see them: a tiny abstraction over one HTTP/1.1 exchange.

`Body` hands out request body bytes as they arrive; `Response` writes a status line, headers and a
body with a Content-Length or chunked, one chunk per `write()`. Both talk to their connection only
through `Wire`, the calls they need from it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Protocol

import httptools

from executor._errors import ExecutorError, PayloadTooLarge, error_json

__all__ = ("Body", "Request", "Response", "Wire", "reason")

BODY_HIGH_WATER = 1024 * 1024
BODY_LOW_WATER = 256 * 1024
DISCARD_BYTES = 4 * 1024 * 1024
DISCARD_SECONDS = 5.0


class Wire(Protocol):
    """What a request and its response need from their connection."""

    def write_raw(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def upgraded(self) -> Body | None: ...


class Body:
    """A request body, readable once, as the bytes arrive."""

    def __init__(self, connection: Wire, expect_continue: bool) -> None:
        self._connection = connection
        self._expect_continue = expect_continue
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._complete = False
        self._lost = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def complete(self) -> bool:
        """Whether the whole body has been received."""
        return self._complete

    async def chunks(self) -> AsyncIterator[bytes]:
        """Yield the body in the pieces it arrives in."""
        if self._expect_continue:
            self._expect_continue = False
            self._connection.write_raw(b"HTTP/1.1 100 Continue\r\n\r\n")
        while True:
            while not self._chunks:
                if self._complete:
                    return
                if self._lost:
                    raise ConnectionResetError("client disconnected while sending the body")
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
            chunk = self._chunks.popleft()
            self._buffered -= len(chunk)
            if self._buffered < BODY_LOW_WATER:
                self._connection.resume_reading()
            yield chunk

    async def discard(self) -> None:
        """Skip what the handler did not read, so that the client sees its response before we close.

        Only a bounded amount, for a bounded time, and never when the client still waits for
        `100 Continue` (it has not sent the body then): past that the connection just closes.
        """
        if self._expect_continue:
            return
        skipped = 0
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(DISCARD_SECONDS):
                async for chunk in self.chunks():
                    skipped += len(chunk)
                    if skipped > DISCARD_BYTES:
                        return

    async def read(self, limit: int) -> bytes:
        """Return the whole body; raise PayloadTooLarge past `limit` bytes."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > BODY_HIGH_WATER:
            self._connection.pause_reading()
        self._wake()

    def finish(self) -> None:
        self._complete = True
        self._wake()

    def lose(self) -> None:
        self._lost = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Request:
    """What the handler gets to know about a request."""

    __slots__ = ("_query", "body", "headers", "http_version", "keep_alive", "method", "path", "query_string")

    def __init__(
        self, method: str, url: bytes, headers: dict[str, str], body: Body, keep_alive: bool, http_version: str
    ) -> None:
        parsed = httptools.parse_url(url)
        self.method = method
        self.http_version = http_version
        self.path: str = parsed.path.decode("latin-1")
        self.query_string: str = (parsed.query or b"").decode("latin-1")
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self._query: dict[str, str] | None = None

    @property
    def query(self) -> dict[str, str]:
        """Query parameters, percent-decoded, first value wins."""
        if self._query is None:
            from urllib.parse import parse_qsl

            self._query = {}
            for key, value in parse_qsl(self.query_string, keep_blank_values=True):
                self._query.setdefault(key, value)
        return self._query


class Response:
    """Writes one response: `send()` for a whole body, or `start()`, `write()`…, `end()`."""

    def __init__(self, connection: Wire, request: Request) -> None:
        self._connection = connection
        self._head_only = request.method == "HEAD"
        self._http10 = request.http_version == "1.0"
        self.keep_alive = request.keep_alive
        self._chunked = False
        self.started = False
        self.finished = False

    async def send(
        self, status: int, body: bytes = b"", content_type: str | None = None, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """Send a complete response with a Content-Length, in one write."""
        if content_type is not None:
            headers = (("content-type", content_type), *headers)
        head = self._head(status, headers, len(body))
        self._connection.write_raw(head if self._head_only else head + body)
        self.finished = True
        await self._connection.drain()

    async def send_error_json(self, error: ExecutorError) -> None:
        """E2B's error for a plain HTTP endpoint: the error's status and `{"code": <status>, "message": ...}`."""
        await self.send(error.status, error_json(error.status, error.message), "application/json")

    async def start(self, status: int, headers: tuple[tuple[str, str], ...] = (), length: int | None = None) -> None:
        """Send the status line and headers; without `length` the body is chunked."""
        self._connection.write_raw(self._head(status, headers, length))
        await self._connection.drain()

    def _head(self, status: int, headers: tuple[tuple[str, str], ...], length: int | None) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason(status)}"]
        lines.extend(f"{name}: {value}" for name, value in headers)
        if status < 200 or status in (204, 304):
            pass  # never a body, so no framing headers
        elif length is not None:
            lines.append(f"content-length: {length}")
        elif self._http10:
            self.keep_alive = False  # HTTP/1.0 has no chunking: the body ends when the connection does
        else:
            self._chunked = True
            lines.append("transfer-encoding: chunked")
        if not self.keep_alive:
            lines.append("connection: close")
        self.started = True
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def upgrade(self, headers: tuple[tuple[str, str], ...]) -> Body:
        """Answer `101 Switching Protocols` and return the connection's bytes from here on (a request with
        `Upgrade` only). `write_raw` then writes to it; the connection closes when the handler returns."""
        stream = self._connection.upgraded()
        if stream is None:
            raise RuntimeError("upgrade() of a request that asked for none")
        lines = ["HTTP/1.1 101 Switching Protocols", *(f"{name}: {value}" for name, value in headers)]
        self._connection.write_raw(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        self.started = self.finished = True
        self.keep_alive = False
        await self._connection.drain()
        return stream

    async def write_raw(self, data: bytes) -> None:
        """Bytes as they are, after `upgrade()`."""
        self._connection.write_raw(data)
        await self._connection.drain()

    async def write(self, data: bytes) -> None:
        """Send part of the body; as its own chunk when chunked, so it is flushed now."""
        if self._head_only or not data:
            return
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        self._connection.write_raw(data)
        await self._connection.drain()

    async def end(self) -> None:
        """Finish the body."""
        if self._chunked and not self._head_only:
            self._connection.write_raw(b"0\r\n\r\n")
        self.finished = True
        await self._connection.drain()


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
