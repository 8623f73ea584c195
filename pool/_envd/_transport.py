"""How `EnvdClient` reaches an executor: one HTTP exchange at a time, through a one-method seam.

`EnvdTransport.exchange` sends one request and yields the response once its head is read, its body still to be
read (a stream is consumed message by message, a download passed on as it comes). Two transports over a socket
connected into the sandbox (`pool._envd._http1`): `SocketTransport` opens a connection per exchange, from an
opener (the activator's `open_upstream`, which may wake the sandbox first, or a runtime's `open_socket`);
`KeptAliveTransport` sends a sequence of exchanges on one connection (a terminal's keystrokes). Others plug in
from outside: `agent-sandbox deploy` reaches envd through the gateway over httpx (`cli._deploy_envd`).

A transport raises `ExecutorError` when the exchange breaks; what the executor answers is the client's concern.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from pool._envd._http1 import Connection, exchange
from pool._errors import ExecutorError

__all__ = ["EnvdTransport", "KeptAliveTransport", "Reply", "SocketOpener", "SocketTransport", "one_socket"]

SocketOpener = Callable[[], Awaitable[socket.socket]]
"""() -> a socket connected to the executor's port inside the sandbox."""


class Reply(Protocol):
    """A response whose head has been read; the body is read on demand."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Header names in lower case."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk, as it arrives."""
        ...

    async def read(self, limit: int = ...) -> bytes:
        """The whole body; ExecutorError past `limit` bytes."""
        ...

    async def prefix(self, limit: int) -> bytes:
        """The body's first `limit` bytes (the rest is left unread)."""
        ...


class EnvdTransport(Protocol):
    """One HTTP exchange with an executor."""

    def exchange(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> AbstractAsyncContextManager[Reply]: ...


class SocketTransport:
    """A connection of its own for each exchange (`Connection: close`), on a socket from `open_socket`.

    `deadline` (seconds) bounds each exchange once connected, until its block ends (TimeoutError); connecting is
    not counted, since the opener may first wake the sandbox and bounds that wait itself.
    """

    def __init__(self, open_socket: SocketOpener, *, deadline: float | None = None) -> None:
        self._open_socket = open_socket
        self._deadline = deadline

    @asynccontextmanager
    async def exchange(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> AsyncIterator[Reply]:
        sock = await self._open_socket()
        async with asyncio.timeout(self._deadline), exchange(sock, method, target, headers, body) as response:
            yield response


class KeptAliveTransport:
    """Exchanges in sequence on one connection, opened on first use and again once the previous one broke or
    closed. Used by one task at a time; `close` ends the connection."""

    def __init__(self, open_socket: SocketOpener) -> None:
        self._open_socket = open_socket
        self._conn: Connection | None = None

    @asynccontextmanager
    async def exchange(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> AsyncIterator[Reply]:
        if self._conn is None or not self._conn.reusable:
            self.close()
            self._conn = await Connection.open(await self._open_socket())
        try:
            yield await self._conn.request(method, target, headers, body)
        except ExecutorError:
            self.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def one_socket(sock: socket.socket) -> SocketOpener:
    """An opener that hands out `sock` once: for a single exchange on a socket the caller already has."""
    handed: list[socket.socket] = [sock]

    async def open_socket() -> socket.socket:
        if not handed:
            raise ExecutorError("the socket into the sandbox was already used for another exchange")
        return handed.pop()

    return open_socket
