"""uvicorn's httptools protocol with the gateway's connection limits: read timeouts, the connection gate, and a
503 past the per-address cap.

A connection's timers, all run by the event loop:

    head        from accept, or from a request's first byte, to its complete head (`header_timeout`); then the
                connection is closed, after a 408 when part of a head came (a client with nothing sent gets
                none: it may be a pooled connection that was about to be used, and would read the 408 as the
                answer to its request)
    body        while a request body is read, the longest the client may send nothing (`body_timeout`); then
                closed. It stops while the server is the one not reading: flow control paused (the app holds
                the request unread, or requests are pipelined), a `100 Continue` not sent yet, a response
                being sent
    keep-alive  uvicorn's own, from a response to the next request's first byte

None of them runs while a response is in flight, so a held request, a stream (SSE, command output) or a WebSocket
(handed to uvicorn's WebSocket protocol, which has no read timeout) is never cut by them.
"""

from __future__ import annotations

import asyncio
import functools
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, ClassVar

import msgspec
from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
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
    """uvicorn's flow control, telling the protocol when it starts reading again."""

    def __init__(self, transport: asyncio.Transport, resumed: Callable[[], None]) -> None:
        super().__init__(transport)
        self._resumed = resumed

    def resume_reading(self) -> None:
        if self.read_paused:
            self._resumed()
        super().resume_reading()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One client connection. The limits and the gate are one server's, set on a subclass (`guarded_protocol`)."""

    limits: ClassVar[ConnectionLimits]
    gate: ClassVar[ConnectionGate]

    def __init__(self, config: Config, server_state: ServerState, app_state: dict[str, Any], _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._head_timer: TimerHandle | None = None
        self._body_timer: TimerHandle | None = None
        self._in_head = False  # part of a request head has come
        self._reading_body = False  # a request head is complete and its body is not
        self._body_seen = 0.0  # loop time of its last byte, or of the server's last pause in reading it
        self._refused = False

    def evict(self) -> None:
        self.transport.close()  # idle: nothing to flush, so its descriptor is closed at once

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self._body_restart)
        admission = self.gate.admit(self, self.client[0] if self.client else "")
        if admission is Admission.DROP:
            transport.abort()
            return
        if admission is Admission.REFUSE:
            self._refused = True
            self.app = _refusal(self.gate.max_per_client)
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._stop_timers()
        self.gate.release(self)

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


def guarded_protocol(limits: ConnectionLimits, gate: ConnectionGate) -> type[GuardedHttpToolsProtocol]:
    """The protocol class of one server (uvicorn is given a class and builds one protocol per connection)."""

    class Bound(GuardedHttpToolsProtocol):
        pass

    Bound.limits = limits
    Bound.gate = gate
    return Bound
