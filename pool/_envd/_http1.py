"""HTTP/1.1 over a socket already connected into a sandbox: how the gateway's UI and tools reach the executor.

Why by hand: the socket comes from the activator's `open_upstream` or a runtime's `open_socket` (connected inside
the sandbox's network namespace, possibly after waking the sandbox), so a client that dials by itself cannot use
it. A connection may be kept alive between requests (a terminal's keystrokes reuse one); requests on it are
sequential (no pipelining). Responses are parsed with httptools, as everywhere else, and their bodies are read
incrementally, so a streaming RPC is consumed message by message and a large file can be passed on as it comes
or abandoned after its first bytes.

Errors: `ExecutorError` when the connection fails, closes early or answers something that is not HTTP.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType

import httptools

from pool._envd._body import BodyReader
from pool._errors import ExecutorError

__all__ = ["Connection", "Response", "exchange"]

_READ_SIZE = 64 * 1024


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


class Response(BodyReader):
    """A response whose head has been read; the body is read on demand."""

    def __init__(self, reader: asyncio.StreamReader, what: str) -> None:
        self._reader = reader
        self.what = what  # "GET /files", for error messages
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

    async def _feed(self) -> None:
        try:
            data = await self._reader.read(_READ_SIZE)
            if not data:
                raise ExecutorError(f"the sandbox closed the connection in the middle of {self.what}")
            self._parser.feed_data(data)
        except (OSError, httptools.HttpParserError) as exc:
            raise ExecutorError(f"{self.what} inside the sandbox failed: {exc}") from exc


class Connection:
    """One HTTP/1.1 connection; `request` may be called again once the previous response was read to its end.

    As an async context manager, the connection is closed when the block ends.
    """

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
            raise ExecutorError(f"connecting into the sandbox failed: {exc}") from exc
        return cls(reader, writer)

    @property
    def reusable(self) -> bool:
        """Open, and the previous response (if any) was read to its end and did not ask to close."""
        last = self._last
        if self._writer.is_closing():
            return False
        return last is None or (last.complete and last.headers.get("connection", "").lower() != "close")

    async def request(self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"") -> Response:
        """Send one request and return the response once its head is read (`Host: envd` unless `headers` name one:
        a server in the sandbox may answer only its own name, as Chromium's DevTools answers only localhost)."""
        what = f"{method} {target.split('?', 1)[0]}"
        if not self.reusable:
            raise ExecutorError(f"the connection cannot carry another request ({what})")
        host = next((value for name, value in headers.items() if name.lower() == "host"), "envd")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "host"]
        response = self._last = Response(self._reader, what)
        try:
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
            if len(body) <= _READ_SIZE:
                self._writer.write(head + body)  # one segment: a second small write could wait for a delayed ACK
            else:
                self._writer.write(head)
                self._writer.write(body)  # a multi-MiB body is not copied once more
            await self._writer.drain()
        except OSError as exc:
            raise ExecutorError(f"{what} inside the sandbox failed: {exc}") from exc
        await response.read_head()
        return response

    def close(self) -> None:
        self._writer.close()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@asynccontextmanager
async def exchange(
    sock: socket.socket, method: str, target: str, headers: Mapping[str, str], body: bytes = b""
) -> AsyncIterator[Response]:
    """Send one request on `sock` (`Connection: close`) and yield the response once its head is read; the socket
    is closed after."""
    async with await Connection.open(sock) as conn:
        yield await conn.request(method, target, {"Connection": "close", **headers}, body)
