"""Egress for local sandboxes: every sandbox's only way out is a proxy the host runs for it.

A sandbox's network namespace has loopback and nothing else: no veth, no address, no forwarding, no change
to the host's sysctls or nftables. When it starts, the host adds inside it a default route over `lo`, an
nftables table (`EgressPolicy.ruleset`) and its own listening sockets: the TCP proxy on `PROXY_PORT` of
127.0.0.1 and ::1 and the DNS forwarder on `DNS_ADDRESS`. The table rejects what the sandbox may not reach
and redirects the rest to those sockets; the host accepts, checks the destination again (`EgressPolicy.allows`,
and that it is none of the host's own addresses) and dials it from the host's namespace. The sandbox's root
holds no CAP_NET_ADMIN, so it can change neither the table nor the route; other sandboxes have no address
at all, so they cannot be dialled. Measured choice and its limits: docs/networking.md, "Egress".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from pool._errors import RuntimeFailure
from pool._local._egress_dns import DnsForwarder, host_nameservers, outbound_socket
from pool._local._egress_names import ClientHelloIncomplete, named_host, resolve
from pool._local._egress_policy import ALWAYS_DENIED, DNS_ADDRESS, PROXY_PORT, EgressPolicy, host_addresses
from pool._local._egress_relay import original_destination, relay, reset
from pool._local._netlink import add_default_routes
from pool._local._netns import Namespaces
from pool._local._nft import run_nft
from pool._runtime import EgressRules

__all__ = ["TABLE", "Egress", "EgressSettings"]

_log = logging.getLogger("pool.egress")
TABLE = "agent_sandbox"  # the nftables table of every sandbox (pod) it guards
_T = TypeVar("_T")


class EgressSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The operator's part of sandbox egress (`serve` flags)."""

    dns_servers: tuple[str, ...] = ()  # the resolvers sandboxes' queries go to; () = the host's own (resolv.conf)
    denied: tuple[str, ...] = ()  # CIDRs no sandbox reaches, on top of ALWAYS_DENIED and the host's addresses
    connect_timeout: float = 10.0  # how long the proxy tries to reach a destination before it resets the sandbox's
    # The proxy's own packets carry it (SO_MARK), and the sandbox's table lets them out: set where the proxy runs in
    # the sandbox's own namespace (the Kubernetes egress guard, pool._kube._guard); 0 for the local runtime's.
    mark: int = 0


@dataclass(eq=False)
class _Attached:
    """One sandbox's host side. Changed on the event loop only."""

    policy: EgressPolicy
    listeners: list[socket.socket]
    dns: DnsForwarder
    accepting: list[asyncio.Task[None]] = field(default_factory=list)
    # relay task → (the address the sandbox dialled, the name its connection sent when a domain rule let it out)
    connections: dict[asyncio.Task[None], tuple[str, str]] = field(default_factory=dict)


class Egress:
    """Sets up, updates and removes the egress of every sandbox of one runtime."""

    def __init__(self, settings: EgressSettings, sockets: Namespaces) -> None:
        self._settings = settings
        self._sockets = sockets
        self._servers = settings.dns_servers or host_nameservers()
        self._always = (*ALWAYS_DENIED, *settings.denied, *host_addresses())
        self._attached: dict[str, _Attached] = {}

    def policy(self, rules: EgressRules) -> EgressPolicy:
        """`rules` parsed; `RuntimeFailure` for an entry that is not what `EgressRules` allows (the API checks)."""
        try:
            return EgressPolicy(rules, always_denied=self._always)
        except ValueError as exc:
            raise RuntimeFailure(f"egress rules that cannot be enforced: {exc}") from exc

    async def attach(self, sandbox_id: str, netns_fd: int, rules: EgressRules, *, fresh: bool = False) -> None:
        """Give the sandbox `rules` (replacing its previous ones, and cutting its connections they now deny).

        A local sandbox that has never had internet gets nothing at all (its loopback is all it can reach): starting
        a warm or an offline sandbox costs nothing, and its first rules cost a creation, not a replacement. Where
        the proxy shares the namespace (`EgressSettings.mark`), which has a network of its own, it is closed.
        `fresh`: the namespace is known to hold no table yet (a start), so none is replaced; a restored or
        re-adopted namespace may hold its old one (CRIU restores nftables; a restart leaves it).
        """
        policy = self.policy(rules)
        attached = self._attached.get(sandbox_id)
        if attached is not None:
            ruleset = policy.ruleset(TABLE, replace=True, mark=self._settings.mark)
            await asyncio.to_thread(self._in_sandbox, netns_fd, lambda: run_nft(ruleset))
            attached.policy = policy
            attached.dns.answering = policy.internet
            for task, (address, name) in attached.connections.items():
                if not (policy.allows(address) or (name and policy.allows_name(name))):
                    task.cancel()
            return
        mark = self._settings.mark
        if not policy.internet and not mark:
            return
        tcp, udp = await asyncio.to_thread(self._in_sandbox, netns_fd, lambda: _set_up(policy, not fresh, mark))
        attached = _Attached(policy, tcp, DnsForwarder(udp, self._servers, mark=mark))
        attached.dns.answering = policy.internet
        attached.accepting = [asyncio.create_task(self._accept(attached, listener)) for listener in tcp]
        self._attached[sandbox_id] = attached

    def detach(self, sandbox_id: str) -> None:
        """Close the sandbox's host side: its listeners, and its open connections with a RST (before a stop or a
        checkpoint: the sandbox's ends of them cannot outlive the host's)."""
        attached = self._attached.pop(sandbox_id, None)
        if attached is None:
            return
        for task in (*attached.accepting, *attached.connections):
            task.cancel()
        for listener in attached.listeners:
            listener.close()
        attached.dns.close()

    def close(self) -> None:
        for sandbox_id in list(self._attached):
            self.detach(sandbox_id)

    def _in_sandbox(self, netns_fd: int, work: Callable[[], _T]) -> _T:
        """Run `work` in the sandbox's network namespace (blocking: a worker thread's namespace is switched)."""
        with self._sockets.inside(netns_fd):
            return work()

    async def _accept(self, attached: _Attached, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        dns = listener.getsockname()[0] == DNS_ADDRESS
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors (EMFILE), or the like: the listener stays, and so do we
                _log.warning("egress: cannot accept a sandbox's connection: %s", exc)
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            try:  # a connection made to the proxy's own address, not redirected, has no original destination
                destination = (self._servers[0], 53) if dns and self._servers else original_destination(conn)
            except OSError:
                reset(conn)
                continue
            task = asyncio.create_task(self._forward(attached, conn, destination, checked=not dns))
            attached.connections[task] = (destination[0], "")
            task.add_done_callback(lambda done: attached.connections.pop(done, None))

    async def _forward(self, attached: _Attached, conn: socket.socket, to: tuple[str, int], *, checked: bool) -> None:
        first = b""
        if not attached.policy.internet:  # DNS over TCP of a sandbox whose rules went offline
            reset(conn)
            return
        if checked:
            try:
                to, first = await self._destination(attached, conn, to)
            except (_Denied, OSError, TimeoutError):
                reset(conn)
                return
        try:
            upstream = outbound_socket(
                socket.AF_INET6 if ":" in to[0] else socket.AF_INET, socket.SOCK_STREAM, self._settings.mark
            )
        except OSError:
            reset(conn)
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(self._settings.connect_timeout):
                await asyncio.get_running_loop().sock_connect(upstream, to)
        except (OSError, TimeoutError):
            reset(conn)
            upstream.close()
            return
        with contextlib.suppress(OSError):
            if first:
                await asyncio.get_running_loop().sock_sendall(upstream, first)
            await relay(conn, upstream)

    async def _destination(
        self, attached: _Attached, conn: socket.socket, to: tuple[str, int]
    ) -> tuple[tuple[str, int], bytes]:
        """Where a redirected connection may go, and the bytes read from it to learn its name; `_Denied` if nowhere.

        By address first; else, with domain rules, by the name its first bytes send, dialled as that name."""
        address, port = to
        policy = attached.policy
        if policy.blocks(address) or _is_local(address):
            raise _Denied
        if policy.allows(address):
            return to, b""
        if not policy.domains:
            raise _Denied
        first, name = await self._first_bytes(conn)
        if name is None or not policy.allows_name(name):
            raise _Denied
        if (task := asyncio.current_task()) is not None:
            attached.connections[task] = (address, name)  # so that `attach` judges it by its name later
        for resolved in await resolve(name, self._servers, mark=self._settings.mark):
            if not policy.blocks(resolved) and not _is_local(resolved):
                return (resolved, port), first
        raise _Denied

    async def _first_bytes(self, conn: socket.socket) -> tuple[bytes, str | None]:
        """Read until the connection's first bytes name a host (TLS SNI, HTTP Host), or cannot any more."""
        loop = asyncio.get_running_loop()
        data = b""
        async with asyncio.timeout(self._settings.connect_timeout):
            while chunk := await loop.sock_recv(conn, 16384):
                data += chunk
                try:
                    return data, named_host(data)
                except ClientHelloIncomplete:
                    continue
        return data, None


class _Denied(Exception):
    """The sandbox may not reach where this connection goes."""


def _set_up(policy: EgressPolicy, replace: bool, mark: int) -> tuple[list[socket.socket], socket.socket]:
    """Inside the sandbox's namespace (blocking): route (where it has none), table, and the host's sockets there
    (all closed again when one cannot be made, e.g. its port taken by the sandbox while no server held it)."""
    add_default_routes()
    run_nft(policy.ruleset(TABLE, replace=replace, mark=mark))
    made: list[socket.socket] = []
    try:
        made += [_listener(socket.AF_INET, "127.0.0.1", PROXY_PORT), _listener(socket.AF_INET, DNS_ADDRESS, 53)]
        with contextlib.suppress(OSError):  # a kernel without IPv6 has no ::1
            made.append(_listener(socket.AF_INET6, "::1", PROXY_PORT))
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(udp)
        udp.bind((DNS_ADDRESS, 53))
    except OSError:
        for sock in made:
            sock.close()
        raise
    return made[:-1], udp


def _listener(family: int, address: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock


def _is_local(address: str) -> bool:
    """Whether `address` is one of this host's (also one added after start): the kernel picks it as its own
    source when asked for a route to it."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, 9))
        except OSError:
            return True
        return bool(probe.getsockname()[0] == address)
