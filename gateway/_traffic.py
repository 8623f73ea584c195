"""Private ports, Host masking and HTTPS ports on the data plane (E2B's `allowPublicTraffic=false`,
`maskRequestHost` and `httpsPorts`).

A sandbox with a traffic access token (`activator.Ingress`) answers on every port but envd's (or, when its
traffic is public, on its template's private ports, e.g. a browser's CDP port) only requests that carry it in
`e2b-traffic-access-token` (any case: the code interpreter SDK sends `E2B-Traffic-Access-Token`); without it,
or with another, E2B's proxy answers 403 JSON `{"sandboxId", "message", "code": 403}` with these messages, and
so does this one (`_errors_response`). The token is compared in constant time and never forwarded
(`_routing.REQUEST_DROP`). envd's port has its own token (`X-Access-Token`), checked by envd.

A template's `local_host_ports` (a browser's DevTools port) get `Host: localhost:<port>`, the only name Chromium
answers, and the proxy swaps that address for the public one in their JSON answers (`webSocketDebuggerUrl`),
so a CDP client on any `--domain` follows them back through the gateway.

A sandbox's `https_ports` (E2B's `httpsPorts`) serve TLS themselves: the proxy speaks TLS to them
(`_upstream.connect_upstream`), whatever the client came over.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import NamedTuple

from activator import Ingress
from gateway._routing import Route, host_header

__all__ = ["TRAFFIC_TOKEN_HEADER", "Forwarding", "TrafficRefused", "admit"]

TRAFFIC_TOKEN_HEADER = b"e2b-traffic-access-token"
_MISSING = "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
_INVALID = "Sandbox is secured with traffic access token. Provided token is invalid."
_PORT_PLACEHOLDER = "${PORT}"


class TrafficRefused(Exception):
    """The sandbox's ports are private and the request lacks the right traffic access token."""

    status_code = 403

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Forwarding(NamedTuple):
    """How an admitted request goes on: the Host it carries (None: the client's own), for a port that answers
    only a local Host, (that local address, the public one) to swap in its JSON answers, and whether the port
    inside is reached over TLS."""

    host: bytes | None = None
    local_address: tuple[bytes, bytes] | None = None
    tls: bool = False


def admit(ingress: Ingress | None, route: Route, headers: Iterable[tuple[bytes, bytes]]) -> Forwarding:
    """How the request goes on, or TrafficRefused.

    `ingress` None admits: an unknown sandbox (the proxy then answers as for any), or envd's port, which the
    data plane exempts without asking for the rules.
    """
    if ingress is None:
        return Forwarding()
    token = ingress.traffic_access_token
    if token is not None and ingress.needs_token(route.port):  # `token` narrowed for the comparison below
        given = next((value for name, value in headers if name == TRAFFIC_TOKEN_HEADER), None)
        if given is None:
            raise TrafficRefused(_MISSING)
        if not hmac.compare_digest(given, token.encode()):
            raise TrafficRefused(_INVALID)
    tls = route.port in ingress.https_ports
    mask = ingress.mask_request_host
    if mask is not None:
        return Forwarding(mask.replace(_PORT_PLACEHOLDER, str(route.port)).encode(), tls=tls)
    if route.port in ingress.local_host_ports:
        local = f"localhost:{route.port}".encode()
        return Forwarding(local, (local, host_header(headers)), tls=tls)
    return Forwarding(tls=tls)
