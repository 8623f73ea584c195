"""A minimal HTTP/1.1 client over a socket already connected into a sandbox: the UI's way to reach envd.

Why by hand: the socket comes from `Activator.open_upstream` (connected inside the sandbox's network namespace,
after waking the sandbox when traffic may wake it), so a client that dials by itself cannot use it. A
connection is kept alive between requests, so a terminal's keystrokes reuse one; requests on it are sequential
(no pipelining). Responses are parsed with httptools, as everywhere else in the gateway, and their bodies are
read incrementally, so a streaming RPC is consumed message by message and a download is passed on as it comes.

Errors: `Http1Error` when the connection fails, closes early or answers something that is not HTTP.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Mapping

import httptools

__all__ = ["Connection", "Http1Error", "Response"]

_READ_SIZE = 64 * 1024


class Http1Error(Exception):
    """The exchange with the server inside the sandbox failed."""


class _Parsed:
    """httptools callbacks for one response: headers, body chunks as parsed, and the end of the message."""

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
    """A response whose head has been read; the body is read on demand."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._parsed = _Parsed()
        self._parser = httptools.HttpResponseParser(self._parsed)
        self.status = 0
        self.headers: dict[str, str] = {}

    @property
    def complete(self) -> bool:
        """The whole body has been read (the connection may carry the next request)."""
        return self._parsed.complete and not self._parsed.body

    async def read_head(self) -> None:
        while not self._parsed.headers_done:
            await self._feed()
        self.status = self._parser.get_status_code()
        self.headers = self._parsed.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk, as it arrives."""
        while True:
            while self._parsed.body:
                yield self._parsed.body.popleft()
            if self._parsed.complete:
                return
            await self._feed()

    async def read(self, limit: int = 16 << 20) -> bytes:
        """The whole body; Http1Error past `limit` bytes (envd's JSON answers are small)."""
        body = bytearray()
        async for chunk in self.chunks():
            body += chunk
            if len(body) > limit:
                raise Http1Error(f"the response is larger than {limit} bytes")
        return bytes(body)

    async def _feed(self) -> None:
        try:
            data = await self._reader.read(_READ_SIZE)
            if not data:
                raise Http1Error("the sandbox closed the connection before the response ended")
            self._parser.feed_data(data)
        except (OSError, httptools.HttpParserError) as exc:
            raise Http1Error(f"reading from the sandbox failed: {exc}") from exc


class Connection:
    """One HTTP/1.1 connection; `request` may be called again once the previous response was read to its end."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._last: Response | None = None

    @classmethod
    async def open(cls, sock: socket.socket) -> Connection:
        """Wrap a connected socket (the connection owns it from now on)."""
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
        except OSError as exc:
            sock.close()
            raise Http1Error(f"connecting into the sandbox failed: {exc}") from exc
        return cls(reader, writer)

    @property
    def reusable(self) -> bool:
        """Open, and the previous response (if any) was read to its end and did not ask to close."""
        last = self._last
        if self._writer.is_closing():
            return False
        return last is None or (last.complete and last.headers.get("connection", "").lower() != "close")

    async def request(self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"") -> Response:
        """Send one request and return the response once its head is read."""
        if not self.reusable:
            raise Http1Error("the connection cannot carry another request")
        lines = [f"{method} {target} HTTP/1.1", "Host: envd", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        response = self._last = Response(self._reader)
        try:
            self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            await self._writer.drain()
        except OSError as exc:
            raise Http1Error(f"writing to the sandbox failed: {exc}") from exc
        await response.read_head()
        return response

    def close(self) -> None:
        self._writer.close()
