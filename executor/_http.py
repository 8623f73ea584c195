"""A small HTTP/1.1 server on asyncio and httptools: just what envd's clients need.

One `Connection` per socket parses requests with `httptools.HttpRequestParser` and runs the handler
for each one in turn on a single worker task (so pipelined requests are answered in order).
Request bodies reach the handler as they arrive (`Body`), Content-Length or chunked; the socket is
paused while too much is buffered. Responses go out with a Content-Length or chunked, one chunk per
`write()` (streaming RPCs depend on it), and `write()` waits while the transport asked us to pause.
A client that disconnects cancels its handler. Header size is bounded; garbage gets a 400. After a
request with `Upgrade`, the bytes that follow are the handler's (`Response.upgrade()`, for WebSockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections import deque
from collections.abc import Awaitable, Callable

import httptools

from executor._errors import error_json
from executor._exchange import Body, Request, Response, reason

__all__ = ("Connection", "Handler", "listen", "stop_on_signals")

logger = logging.getLogger("executor")

MAX_HEADER_BYTES = 64 * 1024
"""Request line plus headers; more gets 431 and the connection is closed."""
MAX_PIPELINED = 16


class _HeadersTooLarge(Exception):
    """Raised inside a parser callback to stop parsing (httptools wraps it in HttpParserError)."""


Handler = Callable[[Request, Response], Awaitable[None]]


class Connection(asyncio.Protocol):
    """One client connection: parses requests and runs the handler for each, in order."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._pending: deque[tuple[Request, Response]] = deque()
        self._worker: asyncio.Task[None] | None = None
        self._body: Body | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._writable = asyncio.Event()  # clear while the transport asks us to stop writing
        self._writable.set()
        self._reading_paused = False
        self._close_after_worker = False
        self._lost = False
        self._upgraded: Body | None = None  # the raw bytes after an Upgrade request's head

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio only does this when the listening socket says proto=IPPROTO_TCP; without it
            # a response written in two pieces waits ~40 ms for the client's delayed ACK.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._upgraded is not None:
            self._upgraded.feed(data)
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # What follows the request's head belongs to the new protocol: the handler takes it with
            # `Response.upgrade()` (a WebSocket), or answers over HTTP; the connection closes after it either way.
            self._close_after_worker = True
            self.on_message_complete()
            self._upgraded = Body(self, False)
            offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
            if data[offset:]:
                self._upgraded.feed(data[offset:])
        except httptools.HttpParserError as exc:  # also wraps what our callbacks raise
            if self._header_bytes > MAX_HEADER_BYTES:
                self._reject(431, f"request headers are larger than {MAX_HEADER_BYTES} bytes")
            else:
                self._reject(400, f"malformed HTTP request: {exc}")

    def eof_received(self) -> bool:
        self._close_after_worker = True
        if self._upgraded is not None:  # the peer of a WebSocket is gone: its reader sees the end
            self._upgraded.finish()
        return self._worker is not None  # keep the write side open to finish the response

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._body is not None:
            self._body.lose()
        if self._upgraded is not None:
            self._upgraded.lose()
        for request, _ in self._pending:
            request.body.lose()
        if self._worker is not None:
            self._worker.cancel()
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        version = self._parser.get_http_version()
        expect = self._headers.get("expect", "").lower() == "100-continue"
        self._body = Body(self, expect and version == "1.1")
        method = self._parser.get_method().decode("ascii")
        request = Request(method, self._url, self._headers, self._body, self._parser.should_keep_alive(), version)
        self._pending.append((request, Response(self, request)))
        if len(self._pending) > MAX_PIPELINED:
            self.pause_reading()
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._serve())

    def on_body(self, body: bytes) -> None:
        if self._body is not None:
            self._body.feed(body)

    def on_message_complete(self) -> None:
        if self._body is not None:
            self._body.finish()
            self._body = None

    # used by Body and Response

    def upgraded(self) -> Body | None:
        return self._upgraded

    def write_raw(self, data: bytes) -> None:
        if self._transport is not None and not self._lost:
            self._transport.write(data)

    async def drain(self) -> None:
        await self._writable.wait()  # several writers may wait: a stream and its keepalives
        if self._lost:
            raise ConnectionResetError("client disconnected")

    def pause_reading(self) -> None:
        if self._transport is not None and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and self._reading_paused and not self._lost:
            self._reading_paused = False
            self._transport.resume_reading()

    # internals

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            raise _HeadersTooLarge

    def _reject(self, status: int, message: str) -> None:
        """Answer a request we could not parse, then close (only when no response is under way)."""
        if self._transport is None:
            return
        if self._worker is None:
            body = error_json(status, message)
            head = f"HTTP/1.1 {status} {reason(status)}\r\ncontent-type: application/json\r\n"
            self._transport.write(f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
        self._transport.close()

    async def _serve(self) -> None:
        while self._pending:
            request, response = self._pending.popleft()
            self.resume_reading()
            await self._run_handler(request, response)
            if response.keep_alive and not request.body.complete:
                await request.body.discard()
            if not (response.keep_alive and request.body.complete) or self._close_after_worker:
                self._close()
                return
        self._worker = None

    async def _run_handler(self, request: Request, response: Response) -> None:
        try:
            await self._handler(request, response)
        except ConnectionError:
            response.keep_alive = False
        except Exception:
            logger.exception("unhandled error in %s %s", request.method, request.path)
            response.keep_alive = False
            if not response.started:
                with contextlib.suppress(ConnectionError):
                    await response.send(500, error_json(500, "internal error"), "application/json")
        if not response.finished:
            response.keep_alive = False  # an unfinished body can only be terminated by closing

    def _close(self) -> None:
        self._worker = None
        if self._transport is not None:
            self._transport.close()


def listen(host: str, port: int, log: logging.Logger) -> socket.socket | None:
    """A listening TCP socket on `host:port` (IPv6 when `host` has a colon), or None once `log` says why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=1024)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, port, exc.strerror or exc)
        return None


def stop_on_signals(loop: asyncio.AbstractEventLoop) -> asyncio.Event:
    """An event that SIGTERM or SIGINT sets."""
    stop = asyncio.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    return stop
