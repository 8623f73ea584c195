"""uvicorn's httptools protocol with the gateway's connection limits: read timeouts, the connection gate, and a
503 past the per-address cap.

A connection's timers, all run by the event loop:

    head        from accept, or from a request's first byte, to its complete head (`header_timeout`); then the
                connection is closed, after a 408 when part of a head came (a client with nothing sent gets
                none: it may be a pooled connection that was about to be used, and would read the 408 as the
                answer to its request)
    body        while a request body is read, the longest the client may send nothing (`body_timeout`); then
                closed. It starts again each time the app asks for more, and stops while the server is the one
                not reading: flow control paused (the app holds the request unread, or requests are pipelined),
                a `100 Continue` not sent yet, a response being sent
    keep-alive  uvicorn's own, from a response to the next request's first byte

None of them runs while a response is in flight, so a held request, a stream (SSE, command output) or a WebSocket
(handed to uvicorn's WebSocket protocol, which has no read timeout) is never cut by them.

Over TLS the protocol shakes hands itself (`loop.start_tls`) instead of leaving it to the listener: asyncio would
hold a connection that never sends its ClientHello for 60 s before the protocol hears of it, uncounted. Here it is
counted from its accept, its handshake is bounded by the head timeout, and it can be evicted while it lasts.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import types
from asyncio import TimerHandle
from collections.abc import Callable, Coroutine, Generator
from typing import Any, ClassVar

import msgspec
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import get_remote_addr, is_ssl
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

from gateway._connection_gate import Admission, ConnectionGate
from gateway._settings import ConnectionLimits

__all__ = ["GuardedHttpToolsProtocol", "GuardedWebSocketProtocol", "guarded_protocol"]

_REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 41\r\n"
    b"connection: close\r\n\r\nThe request head did not arrive in time.\n"
)


class _Refusal(msgspec.Struct):
    code: int
    message: str


@functools.cache
def _refusal(max_per_client: int) -> ASGI3Application:
    """The app of a connection past its address's cap: a 503 in the E2B error shape, then the connection closes."""
    message = f"Too many connections from this address (at most {max_per_client}); retry shortly"
    body = msgspec.json.encode(_Refusal(code=503, message=message))
    headers = [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"), (b"connection", b"close"),
    ]  # fmt: skip

    async def refuse(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return refuse


class _Flow(FlowControl):
    """uvicorn's flow control, telling the protocol each time the app asks for more of the body (uvicorn resumes
    reading then, after it has sent a `100 Continue` that was due): the client's wait starts there."""

    def __init__(self, transport: asyncio.Transport, reading: Callable[[], None]) -> None:
        super().__init__(transport)
        self._reading = reading

    def resume_reading(self) -> None:
        self._reading()
        super().resume_reading()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One client connection. The limits and the gate are one server's, set on a subclass (`guarded_protocol`)."""

    limits: ClassVar[ConnectionLimits]
    gate: ClassVar[ConnectionGate]
    tls: ClassVar[ssl.SSLContext | None]

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any], _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_timer: TimerHandle | None = None
        self._body_timer: TimerHandle | None = None
        self._in_head = False  # part of a request head has come
        self._reading_body = False  # a request head is complete and its body is not
        self._body_seen = 0.0  # loop time of its last byte, or of when the server last asked for more or paused
        self._refused = False
        self._admission: Admission | None = None
        self._raw: asyncio.Transport | None = None  # the TCP transport while its TLS handshake runs
        self._handshake: asyncio.Task[None] | None = None

    def evict(self) -> None:
        (self._raw or self.transport).close()  # idle: nothing to flush, so its descriptor is closed at once

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.tls is not None and not is_ssl(transport):
            self._shake_hands(transport)
            return
        super().connection_made(transport)
        self.flow = _Flow(transport, self._body_restart)
        if self._admission is None:  # over TLS it was admitted at accept
            self._admit(transport)
        if self._admission is Admission.DROP:
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timers()
        self.gate.release(self)
        if self.transport is not None:  # not lost during a TLS handshake
            super().connection_lost(exc)

    def _admit(self, transport: asyncio.Transport) -> None:
        client = get_remote_addr(transport)
        self._admission = self.gate.admit(self, client[0] if client else "")
        if self._admission is Admission.REFUSE:
            self._refused = True
            self.app = _refusal(self.gate.max_per_client)
        if self._admission is not Admission.DROP:
            self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_expired)

    def _shake_hands(self, raw: asyncio.Transport) -> None:
        self._admit(raw)
        if self._admission is Admission.DROP:
            raw.abort()
            return
        self._raw = raw
        # The TLS bytes are for the handshake, never for the HTTP parser. uvloop starts reading as soon as this
        # connection_made returns (a pause here is undone) and a task's first step would come a loop turn later,
        # after a read: so the handshake's first step runs now, which hands the transport to the TLS protocol
        # (it keeps what arrives before its own start), and the rest runs as a task.
        shaking = self._start_tls(raw)
        try:
            first = shaking.send(None)
        except StopIteration:
            return
        self._handshake = self.loop.create_task(_rest_of(shaking, first))

    async def _start_tls(self, raw: asyncio.Transport) -> None:
        assert self.tls is not None
        try:
            transport = await self.loop.start_tls(
                raw, self, self.tls, server_side=True, ssl_handshake_timeout=self.limits.header_timeout
            )
        except OSError:  # the client left, failed the handshake or took too long (SSLError, TimeoutError...)
            raw.abort()
            self.connection_lost(None)
            return
        finally:
            self._raw = None
        if transport is None or transport.is_closing():
            raw.abort()
            self.connection_lost(None)
            return
        self.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._reading_body and self._body_timer is None:
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_expired)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_expired)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._in_head = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.gate.busy(self)
        self._reading_body = True
        self._body_seen = self.loop.time()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_seen = self.loop.time()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._body_restart()
        if self.timeout_keep_alive_task is not None:  # waiting for the next request
            self.gate.idle(self)

    def handle_websocket_upgrade(self) -> None:
        self._stop_timers()
        self._reading_body = False
        super().handle_websocket_upgrade()
        websocket = self.transport.get_protocol()
        if isinstance(websocket, GuardedWebSocketProtocol):  # it counts in the gate until it closes
            websocket.on_lost = lambda: self.gate.release(self)

    def _should_upgrade_to_ws(self) -> bool:
        return not self._refused and super()._should_upgrade_to_ws()

    def _unsupported_upgrade_warning(self) -> None:
        if not self._refused:  # a refused upgrade is answered with the 503, not worth a warning each
            super()._unsupported_upgrade_warning()

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined head, behind a response
            self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_expired)
            return
        if self._raw is not None:  # the TLS handshake is late
            self._raw.close()
            return
        if self.transport.is_closing():
            return
        if self._in_head:
            self.transport.write(_REQUEST_TIMEOUT)
        self.transport.close()

    def _body_expired(self) -> None:
        self._body_timer = None
        if not self._reading_body or self.transport.is_closing():
            return
        cycle = self.cycle
        if (
            self.flow.read_paused
            or cycle.waiting_for_100_continue
            or (cycle.response_started and not cycle.response_complete)
        ):  # the server is the one not reading, or it is answering
            self._body_restart()
        left = self._body_seen + self.limits.body_timeout - self.loop.time()
        if left > 0:
            self._body_timer = self.loop.call_later(left, self._body_expired)
            return
        self.transport.close()

    def _body_restart(self) -> None:
        self._body_seen = self.loop.time()

    def _stop_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, releasing the connection's place in the gate when it closes."""

    on_lost: Callable[[], None] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            if self.on_lost is not None:
                self.on_lost()
                self.on_lost = None


async def _rest_of(coroutine: Coroutine[Any, Any, None], pending: Any) -> None:
    """`_continued` as a coroutine a task accepts (since Python 3.12 `create_task` refuses generator-based ones)."""
    await _continued(coroutine, pending)


@types.coroutine
def _continued(coroutine: Coroutine[Any, Any, None], pending: Any) -> Generator[Any, Any, None]:
    """The rest of `coroutine`, already run up to its first suspension (`pending`, the future it waits for), as
    something a task can run: what the task sends or throws in goes on to `coroutine`."""
    while True:
        try:
            sent = yield pending
        except BaseException as exc:  # a cancellation too: it is the coroutine's to handle
            try:
                pending = coroutine.throw(exc)
            except StopIteration:
                return
        else:
            try:
                pending = coroutine.send(sent)
            except StopIteration:
                return


def guarded_protocol(
    limits: ConnectionLimits, gate: ConnectionGate, tls: ssl.SSLContext | None = None
) -> type[GuardedHttpToolsProtocol]:
    """The protocol class of one server (uvicorn is given a class and builds one protocol per connection); with
    `tls`, the server's TLS, which uvicorn must then not be given."""

    class Bound(GuardedHttpToolsProtocol):
        pass

    Bound.limits = limits
    Bound.gate = gate
    Bound.tls = tls
    return Bound
