"""Which sandbox port, if any, a request is for (e2b-protocol §1.5).

Host form: ``Host: <port>-<sandboxID>.<domain>`` (one label under the domain, case-insensitive, any ``:port``).
Header form: ``E2b-Sandbox-Id`` + ``E2b-Sandbox-Port`` on a request whose Host is an IP literal, ``localhost``,
``sandbox.<domain>``, ``api.<domain>`` or the domain itself (the single-host recipe, e2b-protocol §1.7).
Everything else is the control plane. A request that names a sandbox port badly, or whose Host is longer than a DNS
name and a port, gets a ``RoutingError`` (answered 400), never the control plane, so ``GET /health`` with routing
headers is envd's and without them is ours.

``forwarded_headers`` re-addresses a routed request's headers for the sandbox (both proxies use it).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from activator import MAX_SANDBOX_ID_LENGTH

__all__ = [
    "MAX_HOST_LENGTH",
    "REQUEST_DROP",
    "Route",
    "Router",
    "RoutingError",
    "forwarded_headers",
    "host_header",
    "parse_route",
]


# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus ones the gateway rewrites, plus the
# traffic access token (`_traffic`), which is the gateway's to check and no business of the sandbox.
# Transfer-Encoding stays: the body is forwarded with the same codings, re-chunked.
REQUEST_DROP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade", b"expect"}
    | {b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"e2b-traffic-access-token"}
)
_SCHEMES = {"http": b"http", "https": b"https", "ws": b"http", "wss": b"https"}
_SHOWN = 100  # characters of a rejected host, port or id quoted back in the error
# The longest Host taken: a DNS name (253) and a port. Longer is refused before the per-Host cache, whose 4096
# entries would otherwise hold as many megabyte-long headers.
MAX_HOST_LENGTH = 253 + len(":65535")


class Route(msgspec.Struct, frozen=True):
    """A port of a sandbox; hashable, so it keys the upstream connection pool."""

    sandbox_id: str
    port: int


class RoutingError(Exception):
    """The request addresses a sandbox port, but the host or the routing headers are malformed."""

    status_code = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _ByHeaders:
    """Marker: the host is a shared one, so the routing headers decide."""


_BY_HEADERS = _ByHeaders()
_HostKind = Route | _ByHeaders | None


class Router:
    """Classifies requests for one sandbox domain; the verdict per Host value is cached."""

    def __init__(self, domain: str, *, cache_size: int = 4096) -> None:
        domain = domain.strip(".").lower()
        if not domain or ".." in domain:
            raise ValueError(f"invalid sandbox domain {domain!r}")
        self._suffix = "." + domain
        # `api.<domain>` is where the wildcard-DNS recipe points E2B_API_URL (e2b-protocol §1.7 B).
        self._shared_hosts = frozenset({"localhost", domain, "sandbox." + domain, "api." + domain})
        # Hosts repeat (one per sandbox port and client), so the string work runs once per distinct Host.
        self._classify: Callable[[bytes | str], _HostKind] = functools.lru_cache(maxsize=cache_size)(
            self._classify_host
        )

    def parse(self, host: bytes | str, headers: Iterable[tuple[bytes, bytes]]) -> Route | None:
        """The sandbox port the request is for, or None for the control plane; ASGI header names are lowercase."""
        if len(host) > MAX_HOST_LENGTH:
            raise RoutingError(f"Invalid Host: longer than {MAX_HOST_LENGTH} characters")
        kind = self._classify(host)
        if isinstance(kind, _ByHeaders):
            return _route_from_headers(headers)
        return kind

    def _classify_host(self, host: bytes | str) -> _HostKind:
        name = _strip_port(host.decode("latin-1") if isinstance(host, bytes) else host).lower()
        if not name or name in self._shared_hosts or _is_ip_literal(name):
            return _BY_HEADERS
        if not name.endswith(self._suffix):
            return None
        label = name[: -len(self._suffix)]
        port, dash, sandbox_id = label.partition("-")
        if "." in label or not dash:
            raise RoutingError(f"Invalid sandbox host {_shown(name)}: expected <port>-<sandboxID>{self._suffix}")
        return _route(port, sandbox_id)


def parse_route(host: bytes | str, headers: Iterable[tuple[bytes, bytes]], domain: str) -> Route | None:
    """The sandbox port a request is for, or None for the control plane (see the module docstring)."""
    return _router(domain).parse(host, headers)


_router = functools.lru_cache(maxsize=8)(Router)


def host_header(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The Host header of an ASGI scope, or b"" (HTTP/1.0 clients may omit it)."""
    for name, value in headers:
        if name == b"host":
            return value
    return b""


def _route_from_headers(headers: Iterable[tuple[bytes, bytes]]) -> Route | None:
    sandbox_id = port = None
    for name, value in headers:
        if name == b"e2b-sandbox-id":
            sandbox_id = value
        elif name == b"e2b-sandbox-port":
            port = value
    if sandbox_id is None and port is None:
        return None
    if sandbox_id is None or port is None:
        raise RoutingError("Both E2b-Sandbox-Id and E2b-Sandbox-Port headers are required")
    return _route(port.decode("latin-1"), sandbox_id.decode("latin-1"))


def _route(port: str, sandbox_id: str) -> Route:
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise RoutingError(f"Invalid sandbox port {_shown(port)}: expected an integer from 1 to 65535")
    valid = sandbox_id.isascii() and sandbox_id.isalnum() and sandbox_id == sandbox_id.lower()
    if not valid or len(sandbox_id) > MAX_SANDBOX_ID_LENGTH:
        expected = f"up to {MAX_SANDBOX_ID_LENGTH} lowercase letters and digits"
        raise RoutingError(f"Invalid sandbox ID {_shown(sandbox_id)}: expected {expected}")
    return Route(sandbox_id, int(port))


def _shown(value: str) -> str:
    """`value` quoted for an error message, cut short: a 60 kB Host is not sent back whole."""
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


def _strip_port(host: str) -> str:
    if host.startswith("["):  # [v6]:port
        return host[: host.find("]") + 1]
    name, colon, port = host.rpartition(":")
    return name if colon and port.isdigit() else host


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def forwarded_headers(
    scope: Mapping[str, Any], drop: frozenset[bytes], *, host: bytes | None = None
) -> list[tuple[bytes, bytes]]:
    """The client's headers minus ``drop`` and those its Connection header names, plus X-Forwarded-*; ``host``
    replaces the client's Host (``maskRequestHost``), which X-Forwarded-Host still names."""
    kept = []
    forwarded_for = original = b""
    listed = None
    for name, value in scope["headers"]:
        if name in drop:
            if name == b"x-forwarded-for":
                forwarded_for = value
            elif name == b"connection":
                listed = value
            continue
        if name == b"host":
            original = value
            value = host or value
        kept.append((name, value))
    if listed is not None:
        extra = {token.strip().lower() for token in listed.split(b",")}
        kept = [header for header in kept if header[0] not in extra]
    client = scope.get("client")
    if client:
        kept.append((b"x-forwarded-for", _forwarded_for(forwarded_for, client[0].encode())))
    kept.append((b"x-forwarded-proto", _SCHEMES.get(scope.get("scheme", "http"), b"http")))
    if original:
        kept.append((b"x-forwarded-host", original))
    return kept


def _forwarded_for(chain: bytes, client: bytes) -> bytes:
    """``chain`` plus the client, unless the server already took the client from it (uvicorn --proxy-headers)."""
    if not chain:
        return client
    return chain if chain.rpartition(b",")[2].strip() == client else chain + b", " + client
