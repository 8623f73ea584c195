"""What the data plane needs below it: sockets into sandboxes, and a pool of idle keep-alive connections.

``UpstreamOpener`` is declared here, by its consumer, and satisfied by the activator: it resumes the sandbox
if needed (holding the caller, bounded) and returns a socket connected inside the sandbox's network. The
lifecycle errors it raises (``activator._errors``) are mapped to responses in ``gateway._errors_response``.

A sandbox's HTTPS ports (E2B's `httpsPorts`) are reached over TLS that verifies nothing, as E2B's proxy does
(self-signed certificates work): the sandbox is the one the route names, reached over its own socket, so there
is no one in between to authenticate against. The SNI is the name of the Host the request carries there (the
masked one, else `localhost`), and only HTTP/1.1 is offered.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from activator import Ingress
from gateway._routing import Route

__all__ = ["PooledConnection", "UpstreamError", "UpstreamOpener", "UpstreamPool", "connect_upstream"]

_TLS_HANDSHAKE_TIMEOUT = 10.0


class UpstreamOpener(Protocol):
    """The lifecycle layer, as the proxies see it."""

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected non-blocking TCP socket to ``port`` inside the sandbox, resuming it first if needed."""
        ...

    def touch(self, sandbox_id: str) -> None:
        """Records activity for the idle policy; called per request and per WebSocket frame, so it is cheap."""
        ...

    async def ingress(self, sandbox_id: str) -> Ingress | None:
        """The sandbox's traffic token and Host mask, or None when it is unknown; per request, so it is cheap."""
        ...


P = TypeVar("P", bound=asyncio.BaseProtocol)


async def connect_upstream(
    opener: UpstreamOpener, route: Route, protocol: Callable[[], P], *, tls: bool, host: bytes | None = None
) -> P:
    """`protocol` on a new connection to ``route`` (over TLS when `tls`, naming `host`'s name in its SNI); the
    socket is closed on failure."""
    sock = await opener.open_upstream(route.sandbox_id, route.port)
    loop = asyncio.get_running_loop()
    try:
        if tls:
            _, connected = await loop.create_connection(
                protocol, sock=sock, ssl=_upstream_tls(), server_hostname=_server_name(host),
                ssl_handshake_timeout=_TLS_HANDSHAKE_TIMEOUT,
            )  # fmt: skip
        else:
            _, connected = await loop.create_connection(protocol, sock=sock)
    except BaseException:
        sock.close()
        raise
    return connected


def _server_name(host: bytes | None) -> str:
    """The name in a Host header (`name[:port]`); `localhost` for none, or for an IP address, which SNI cannot carry."""
    text = (host or b"").decode("latin-1")
    name = text[1 : text.find("]")] if text.startswith("[") else text.partition(":")[0]
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name or "localhost"
    return "localhost"


@functools.cache
def _upstream_tls() -> ssl.SSLContext:
    """The client context for HTTPS ports: no verification (see the module's docstring), HTTP/1.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    return context


class UpstreamError(Exception):
    """The sandbox's server broke the exchange: it spoke something other than HTTP, or hung up mid-response."""


class PooledConnection(Protocol):
    """What the pool needs from a connection."""

    def is_reusable(self) -> bool:
        """True while the connection is open and its last exchange ended cleanly."""
        ...

    def close(self) -> None: ...


C = TypeVar("C", bound=PooledConnection)


class UpstreamPool(Generic[C]):
    """Idle keep-alive upstream connections per sandbox port: LIFO, bounded, expiring.

    A connection is taken out for exactly one request and put back only when that exchange ended cleanly, so
    an idle connection never carries bytes of an earlier request. A connection the sandbox closed while idle
    is noticed (``is_reusable``) when it is taken and discarded before anything is written to it; that is the
    only retry there is, because once request bytes are written they may have been processed.
    All methods run on the event loop thread; nothing here awaits, so no lock is needed.
    """

    def __init__(self, *, max_idle_per_port: int = 32, max_idle: int = 1024, idle_timeout: float = 4.0) -> None:
        if max_idle_per_port < 0 or max_idle < 0 or idle_timeout <= 0:
            raise ValueError("pool limits must be non-negative and idle_timeout positive")
        self._max_per_port = max_idle_per_port
        self._max_idle = max_idle
        # Below the 5 s keep-alive timeout of common servers (uvicorn, Node), so the sandbox rarely closes a
        # connection at the moment we reuse it.
        self._idle_timeout = idle_timeout
        self._idle: dict[Route, deque[tuple[float, C]]] = {}  # oldest first; empty deques stay until a sweep
        self._count = 0
        self._sweeper: asyncio.TimerHandle | None = None

    def take(self, route: Route) -> C | None:
        """The most recently used live idle connection to ``route``, or None."""
        idle = self._idle.get(route)
        while idle:
            conn = idle.pop()[1]
            self._count -= 1
            if conn.is_reusable():
                return conn
            conn.close()
        return None

    def put(self, route: Route, conn: C) -> None:
        """Keeps ``conn`` for reuse if it is reusable and there is room, else closes it."""
        idle = self._idle.get(route)
        if idle is None:
            idle = self._idle[route] = deque()
        if not conn.is_reusable() or self._count >= self._max_idle or len(idle) >= self._max_per_port:
            conn.close()
            return
        loop = asyncio.get_running_loop()
        idle.append((loop.time(), conn))
        self._count += 1
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._idle_timeout, self._sweep)

    def drop(self, sandbox_id: str) -> None:
        """Closes every idle connection into ``sandbox_id``; called when it is paused or stopped."""
        for route in [route for route in self._idle if route.sandbox_id == sandbox_id]:
            self._close_all(self._idle.pop(route))

    def close(self) -> None:
        """Closes every idle connection (gateway shutdown)."""
        for idle in self._idle.values():
            self._close_all(idle)
        self._idle.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _close_all(self, idle: deque[tuple[float, C]]) -> None:
        self._count -= len(idle)
        for _, conn in idle:
            conn.close()
        idle.clear()

    def _sweep(self) -> None:
        """Closes connections idle longer than the timeout; re-arms itself while any remain."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() - self._idle_timeout
        for route, idle in list(self._idle.items()):
            while idle and idle[0][0] <= deadline:
                idle.popleft()[1].close()
                self._count -= 1
            if not idle:
                del self._idle[route]
        if self._count:
            self._sweeper = loop.call_later(self._idle_timeout / 2, self._sweep)
