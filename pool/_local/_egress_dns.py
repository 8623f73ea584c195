"""The DNS forwarder every sandbox's resolver points at (`DNS_ADDRESS`, UDP and TCP port 53 inside it).

The host's resolver is often unreachable from a sandbox by design (127.0.0.53 of systemd-resolved, or an
address in a private range, which sandboxes never reach): the forwarder's sockets live in the sandbox's
namespace, but it asks the configured servers from the host's, one query at a time per datagram, the first
answer wins. A sandbox has at most `_MAX_INFLIGHT` queries open; more are dropped, as a busy resolver would.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from pathlib import Path

__all__ = ["DnsForwarder", "host_nameservers", "outbound_socket"]

_MAX_INFLIGHT = 64
_QUERY_TIMEOUT = 3.0


def host_nameservers(resolv_conf: Path = Path("/etc/resolv.conf")) -> tuple[str, ...]:
    """The host's resolvers, as its /etc/resolv.conf names them."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return ()
    found = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
    return tuple(found)


class DnsForwarder:
    """Answers one sandbox's UDP queries on `sock` (made inside its namespace) from the host's `servers`."""

    def __init__(self, sock: socket.socket, servers: tuple[str, ...], *, mark: int = 0) -> None:
        self._sock = sock
        self._servers = servers
        self._mark = mark
        self._loop = asyncio.get_running_loop()
        self._inflight: set[asyncio.Task[None]] = set()  # this sandbox's open queries (the loop's thread only)
        self.answering = True  # False while the sandbox has no internet: its queries are answered REFUSED at once
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._receive)

    def close(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        for task in self._inflight:
            task.cancel()

    def _receive(self) -> None:
        while True:
            try:
                query, client = self._sock.recvfrom(4096)
            except OSError:  # BlockingIOError: every waiting query is read
                return
            if len(query) <= 12:
                continue
            if not self.answering:
                with contextlib.suppress(OSError):
                    self._sock.sendto(_refused(query), client)
            elif len(self._inflight) < _MAX_INFLIGHT:
                task = self._loop.create_task(self._answer(query, client))
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)

    async def _answer(self, query: bytes, client: tuple[str, int]) -> None:
        for server in self._servers:
            answer = await ask(server, query, mark=self._mark)
            if answer is not None:
                with contextlib.suppress(OSError):
                    self._sock.sendto(answer, client)
                return


def outbound_socket(family: int, kind: int, mark: int) -> socket.socket:
    """A non-blocking socket of the proxy's own, to where a sandbox's traffic goes; with `mark` (SO_MARK, which
    takes CAP_NET_ADMIN) where the proxy shares the sandbox's namespace, so that its table lets it through."""
    sock = socket.socket(family, kind)
    try:
        if mark:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


async def ask(server: str, query: bytes, *, mark: int = 0) -> bytes | None:
    """One UDP exchange with `server` from the host; None when it does not answer in time."""
    family = socket.AF_INET6 if ipaddress.ip_address(server).version == 6 else socket.AF_INET
    loop = asyncio.get_running_loop()
    with outbound_socket(family, socket.SOCK_DGRAM, mark) as upstream:
        try:
            upstream.connect((server, 53))
            upstream.send(query)
            async with asyncio.timeout(_QUERY_TIMEOUT):
                while True:
                    answer = await loop.sock_recv(upstream, 65535)
                    if answer[:2] == query[:2]:
                        return answer
        except (OSError, TimeoutError):
            return None


def _refused(query: bytes) -> bytes:
    """The query turned into its answer with RCODE 5 (REFUSED): same id, opcode and question."""
    return query[:2] + bytes([0x80 | (query[2] & 0x79), 0x05]) + query[4:]
