"""One HTTP/1.1 request over a socket that is already connected into a sandbox (from `Activator.open_upstream`).

Why by hand: the socket comes from the activator (it may have resumed the sandbox, and it is connected inside
the sandbox's network namespace), so a client that dials by itself cannot use it, and one request per
connection (`Connection: close`) is all the tools need. Responses are parsed with httptools, the parser the
gateway and the executor already use; the body is read incrementally, so a streaming RPC can be consumed message
by message and a large file can be abandoned after its first bytes.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httptools

from activator._mcp._errors import ExecutorFailed

__all__ = ["Response", "exchange"]

_READ_SIZE = 64 * 1024


class _Collector:
    """httptools callbacks: headers, body chunks as they are parsed, and the end of the message."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.body: deque[bytes] = deque()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(bytes(body))

    def on_message_complete(self) -> None:
        self.complete = True


class Response:
    """A response whose head has been read; its body is read on demand."""

    def __init__(self, reader: asyncio.StreamReader, what: str) -> None:
        self._reader = reader
        self._what = what  # "GET /files", for error messages
        self._collector = _Collector()
        self._parser = httptools.HttpResponseParser(self._collector)
        self.status = 0
        self.headers: dict[str, str] = {}

    async def read_head(self) -> None:
        while not self._collector.headers_done:
            await self._feed()
        self.status = self._parser.get_status_code()
        self.headers = self._collector.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk, as it arrives."""
        while True:
            while self._collector.body:
                yield self._collector.body.popleft()
            if self._collector.complete:
                return
            await self._feed()

    async def read(self, limit: int | None = None) -> bytes:
        """The body, or its first `limit` bytes (the rest is left unread)."""
        body = bytearray()
        async for chunk in self.chunks():
            body += chunk
            if limit is not None and len(body) >= limit:
                return bytes(body[:limit])
        return bytes(body)

    async def _feed(self) -> None:
        try:
            data = await self._reader.read(_READ_SIZE)
            if not data:
                raise ExecutorFailed(f"the sandbox closed the connection in the middle of {self._what}; retry the call")
            self._parser.feed_data(data)
        except (OSError, httptools.HttpParserError) as exc:
            raise ExecutorFailed(f"{self._what} inside the sandbox failed: {exc}") from exc


@asynccontextmanager
async def exchange(
    sock: socket.socket, method: str, target: str, headers: Mapping[str, str], body: bytes = b""
) -> AsyncIterator[Response]:
    """Send one request on `sock` and yield the response once its head is read; the socket is closed after."""
    what = f"{method} {target.split('?', 1)[0]}"
    lines = [f"{method} {target} HTTP/1.1", "Host: envd", "Connection: close", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    try:
        reader, writer = await asyncio.open_connection(sock=sock)
    except OSError as exc:
        sock.close()
        raise ExecutorFailed(f"{what} inside the sandbox failed: {exc}") from exc
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        response = Response(reader, what)
        await response.read_head()
        yield response
    finally:
        writer.close()
