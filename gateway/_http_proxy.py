"""The HTTP/1.1 reverse proxy from an ASGI request to a sandbox port.

The upstream side is a hand-written asyncio Protocol over ``httptools`` (an httpx-based proxy manages a tenth
of the throughput, reference/anchors.md §6). Both bodies stream: request chunks are written upstream as they
arrive, response chunks are sent to the client as they arrive, and each side's buffer is bounded by pausing
the other side (upstream ``pause_reading``, client ``send`` awaiting the server's drain).

Per request the proxy runs one helper task, ``_pump_request``: it writes the rest of the request body and
then waits for the client to disconnect, which aborts the upstream exchange.
"""

from __future__ import annotations

import asyncio
from typing import cast

import httptools

from gateway._errors_response import REPLIED_ERRORS, Receive, Scope, Send, error_reply, send_error
from gateway._routing import REQUEST_DROP, Route, forwarded_headers
from gateway._traffic import Forwarding
from gateway._upstream import UpstreamError, UpstreamOpener, UpstreamPool, connect_upstream

__all__ = ["RESPONSE_DROP", "UpstreamConnection", "proxy_http"]

# Like nginx, the gateway's own Date and Server replace the sandbox's.
RESPONSE_DROP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"})
RESPONSE_DROP |= {b"trailer", b"date", b"server"}
_HIGH_WATER = 256 * 1024  # response bytes buffered from the sandbox before it is paused


MAX_REWRITTEN_BYTES = 1 << 20  # a DevTools /json answer is a few KiB per tab


class _ClientGone(Exception):
    """The client disconnected; the exchange is abandoned without a response."""


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection into a sandbox port.

    Owned by one request at a time (the pool holds it in between). Parser callbacks fill the per-response
    fields and wake the request's task, which is the only reader of them.
    """

    _transport: asyncio.Transport

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None  # the request task waiting for response progress
        self._drain: asyncio.Future[None] | None = None  # the task waiting for the upstream to take writes
        self._write_paused = self._reading_paused = self._lost = False
        self._error: Exception | None = None
        self.complete = True  # no response outstanding: unexpected bytes from the sandbox end the connection
        self._reset(head_request=False)

    def _reset(self, *, head_request: bool) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = self._keep_alive = self._request_sent = self._delimited = False
        self._head_request = head_request
        self._chunks: list[bytes] = []
        self._buffered = 0

    # The request side, driven by the request's task.

    def begin(self, head: bytes, body: bytes, *, more_body: bool, chunked: bool, head_request: bool) -> None:
        """Writes the request head and the first body chunk."""
        self._reset(head_request=head_request)
        self.complete = False
        self._write([head, *_frame(body, more_body=more_body, chunked=chunked)], more_body=more_body)

    def send_body(self, body: bytes, *, more_body: bool, chunked: bool) -> None:
        self._write(_frame(body, more_body=more_body, chunked=chunked), more_body=more_body)

    def _write(self, parts: list[bytes], *, more_body: bool) -> None:
        if self._transport.is_closing():  # uvloop raises on writes to a closed transport; asyncio drops them
            raise UpstreamError("The sandbox closed the connection")
        self._transport.writelines(parts)
        self._request_sent = not more_body

    async def drain(self) -> None:
        """Waits until the sandbox takes our writes; raises if the connection is gone."""
        if self._write_paused and not self._lost:
            self._drain = self._loop.create_future()
            await self._drain
        if self._lost:
            raise self._error or UpstreamError("The sandbox closed the connection")

    async def response_head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        while not self.head_done:
            await self._wait()
        return self.status, self.headers

    async def response_body(self) -> tuple[bytes, bool]:
        """All body bytes received so far (waiting for some), and whether the body is complete."""
        while not self._chunks and not self.complete:
            await self._wait()
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()
        return body, self.complete

    def abort(self, exc: Exception) -> None:
        """Ends the exchange with ``exc`` (raised in the waiting task) and drops the connection."""
        self._fail(exc)
        self._transport.abort()

    def is_reusable(self) -> bool:
        return self._keep_alive and self._request_sent and not self._lost and not self._transport.is_closing()

    def close(self) -> None:
        self._transport.close()

    async def _wait(self) -> None:
        if self._error is None:
            self._waiter = self._loop.create_future()
            await self._waiter
        if self._error is not None:
            raise self._error

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if self._error is None:
            self._error = exc
        self._keep_alive = False
        self._wake()

    # asyncio.Protocol callbacks.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self.complete:  # bytes nobody asked for: the stream can no longer be trusted
            self._keep_alive = False
            self._transport.close()
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._fail(UpstreamError(f"invalid HTTP response ({exc})"))
            self._transport.close()

    def eof_received(self) -> None:
        self._end_of_body()
        self._keep_alive = False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is None and self._error is None:
            self._end_of_body()  # over TLS (an HTTPS port), uvloop reports a close without close_notify only here
        if not self.complete:
            self._fail(UpstreamError("The sandbox closed the connection before the response was complete"))
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _end_of_body(self) -> None:
        if self.head_done and not self.complete and not self._delimited:
            self.on_message_complete()  # the body was delimited by the end of the connection

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            drain.set_result(None)

    # httptools callbacks (only the ones defined here are called).

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in RESPONSE_DROP:
            self._delimited |= name == b"transfer-encoding"
        else:
            self._delimited |= name == b"content-length"
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # an interim response (100 Continue, 103 Early Hints): the real one follows
            self.headers = []
            self._delimited = False
            return
        if self.head_done or status >= 600:
            self._fail(UpstreamError(f"unexpected response (status {status})"))
            return
        if status == 204 or status == 304:  # a length here describes another response; servers reject it
            self.headers = [header for header in self.headers if header[0] != b"content-length"]
        self.status = status
        self.head_done = True
        if self._head_request:  # no body follows, though the parser does not know it: never reuse
            self.complete = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.head_done and not self.complete:
            self.complete = True
            self._keep_alive = self._parser.should_keep_alive() and not self._head_request
            self._wake()


def _frame(body: bytes, *, more_body: bool, chunked: bool) -> list[bytes]:
    if not chunked:
        return [body]
    parts = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
    if not more_body:
        parts.append(b"0\r\n\r\n")
    return parts


def _request_head(scope: Scope, host: bytes | None) -> tuple[bytes, bool]:
    """The request line and headers for the sandbox (Host replaced by ``host`` if given), and whether the body
    goes chunked."""
    target = scope.get("raw_path") or scope["path"].encode()
    if scope["query_string"]:
        target += b"?" + scope["query_string"]
    parts = [scope["method"].encode(), b" ", target, b" HTTP/1.1\r\n"]
    chunked = False
    for name, value in forwarded_headers(scope, REQUEST_DROP, host=host):
        chunked |= name == b"transfer-encoding"
        parts += (name, b": ", value, b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts), chunked


async def proxy_http(
    scope: Scope,
    receive: Receive,
    send: Send,
    route: Route,
    opener: UpstreamOpener,
    pool: UpstreamPool[UpstreamConnection],
    forwarding: Forwarding,
) -> None:
    """Forwards one request to ``route`` as ``forwarding`` says (its Host, if given; over TLS to an HTTPS port)
    and streams the response back; failures become E2B-shaped errors. With ``forwarding.local_address`` (local,
    public), a JSON answer naming the local address is read whole (at most `MAX_REWRITTEN_BYTES`) and gets the
    public one instead."""
    head, chunked = _request_head(scope, forwarding.host)
    local_address = forwarding.local_address
    first = await receive()
    if first["type"] != "http.request":
        return
    more_body = first.get("more_body", False)
    try:
        conn = pool.take(route) or await connect_upstream(
            opener, route, UpstreamConnection, tls=forwarding.tls, host=forwarding.host
        )
        conn.begin(
            head, first.get("body", b""), more_body=more_body, chunked=chunked, head_request=scope["method"] == "HEAD"
        )
    except REPLIED_ERRORS as exc:
        await send_error(send, error_reply(exc, route.sandbox_id))
        return
    pump = asyncio.create_task(_pump_request(receive, conn, more_body=more_body, chunked=chunked))
    try:
        rewrite = None if local_address is None else (*local_address, scope["scheme"] == "https")
        await _relay_response(conn, send, route.sandbox_id, rewrite)
    except (_ClientGone, UpstreamError, OSError):  # OSError: servers that raise on sends to a gone client
        pass  # nothing more can be said to the client; returning early makes the server close its connection
    finally:
        pump.cancel()  # before the connection can be reused: the pump must not touch it again
        pool.put(route, conn)


async def _relay_response(
    conn: UpstreamConnection, send: Send, sandbox_id: str, rewrite: tuple[bytes, bytes, bool] | None
) -> None:
    try:
        status, headers = await conn.response_head()
    except UpstreamError as exc:
        await send_error(send, error_reply(exc, sandbox_id))
        return
    if rewrite is not None and any(
        name == b"content-type" and value.lower().startswith(b"application/json") for name, value in headers
    ):
        try:
            await _relay_rewritten(conn, send, status, headers, rewrite)
        except UpstreamError as exc:  # nothing was sent yet: the client gets an answer in E2B's shape
            await send_error(send, error_reply(exc, sandbox_id))
        return
    await send({"type": "http.response.start", "status": status, "headers": headers})
    complete = False
    while not complete:
        body, complete = await conn.response_body()
        await send({"type": "http.response.body", "body": body, "more_body": not complete})


async def _relay_rewritten(
    conn: UpstreamConnection, send: Send, status: int, headers: list[tuple[bytes, bytes]],
    rewrite: tuple[bytes, bytes, bool],
) -> None:  # fmt: skip
    """A small JSON answer with its local address swapped for the public one (`ws` for `wss`, `http` for
    `https` when the client came over TLS), and its length fixed."""
    body, complete = b"", False
    while not complete and len(body) <= MAX_REWRITTEN_BYTES:
        chunk, complete = await conn.response_body()
        body += chunk
    if not complete:
        raise UpstreamError("a JSON answer to rewrite is larger than the proxy reads whole")
    local, public, secure = rewrite
    ws, http = (b"wss", b"https") if secure else (b"ws", b"http")
    for old, new in ((b"ws://", ws + b"://"), (b"ws=", ws + b"="), (b"http://", http + b"://")):
        body = body.replace(old + local + b"/", new + public + b"/")
    kept = [(name, value) for name, value in headers if name not in (b"content-length", b"transfer-encoding")]
    await send({"type": "http.response.start", "status": status, "headers": [*kept, (b"content-length",
                str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _pump_request(receive: Receive, conn: UpstreamConnection, *, more_body: bool, chunked: bool) -> None:
    """Writes the rest of the request body upstream, then aborts the exchange when the client disconnects."""
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            if more_body:
                more_body = message.get("more_body", False)
                conn.send_body(message.get("body", b""), more_body=more_body, chunked=chunked)
                await conn.drain()
    except UpstreamError:
        return  # the request task sees the same failure on the response side
    conn.abort(_ClientGone())
