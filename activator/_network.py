"""E2B's network options, checked as E2B's API checks them (infra `sandbox_create.go`, `sandbox-network/firewall.go`).

    denyOut               IPs and CIDRs only: anything else is 400 "invalid denied CIDR <x>"; an unspecified address
                          (0.0.0.0, ::, 0.0.0.0/8) only as 0.0.0.0/0 itself
    allowOut              IPs, CIDRs and domains (`example.com`, `*.example.com`); an address must be a specified one
                          ("invalid allowed address <x>"); any domain needs 0.0.0.0/0 itself in denyOut
    allow_internet_access false: denyOut becomes 0.0.0.0/0, whatever it held; allowOut stays (allow beats deny)
    maskRequestHost       host[:port] with an ASCII host; `${PORT}` may stand anywhere in it for the port
    allowPublicTraffic    false needs a secured envd (v2 always is; v1 only with `secure`)

Stricter than E2B where E2B would store something nothing can honour: an entry with a port (`example.com:443`,
E2B's newer form; rules here hold for every port), an empty entry, and a mask whose host is empty, has an empty
label or whose port is not a number are refused too. Errors are `InvalidRequest` (400) with E2B's messages.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from activator._errors import InvalidRequest
from activator._records import Egress
from pool import ENVD_PORT

__all__ = [
    "DOMAINS_NEED_ALL_TRAFFIC", "E2B_ALL_TRAFFIC", "MAX_HTTPS_PORTS", "check_private_ingress", "egress_in_force",
    "https_ports", "mask_host",
]  # fmt: skip

MAX_HTTPS_PORTS = 100

E2B_ALL_TRAFFIC = "0.0.0.0/0"  # the SDK's ALL_TRAFFIC
DOMAINS_NEED_ALL_TRAFFIC = (
    "When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out to block all other "
    "traffic."
)
_PRIVATE_NEEDS_SECURE = (
    "You cannot create a sandbox without public access unless you enable secure envd access via 'secure' flag."
)
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?")
_PORT_PLACEHOLDER = "${PORT}"


def egress_in_force(
    allow_out: Sequence[str] | None, deny_out: Sequence[str] | None, *, allow_internet_access: bool | None
) -> Egress:
    """The egress rules a create or `update_network` asks for, checked, with `allow_internet_access` folded in."""
    allow, deny = tuple(allow_out or ()), tuple(deny_out or ())
    for entry in deny:
        if not _specified_address(entry):
            raise InvalidRequest(f"invalid denied CIDR {entry}")
    domains = [entry for entry in allow if _address(entry) is None]
    for entry in allow:
        if entry not in domains and not _specified_address(entry):
            raise InvalidRequest(f"invalid allowed address {entry}")
    for domain in domains:
        if not domain or ":" in domain or "[" in domain:
            raise InvalidRequest(f"invalid allowed address {domain}: an entry holds for every port here")
    if domains and E2B_ALL_TRAFFIC not in deny:
        raise InvalidRequest(DOMAINS_NEED_ALL_TRAFFIC)
    if allow_internet_access is False:
        deny = (E2B_ALL_TRAFFIC,)
    return Egress(allow_out=allow, deny_out=deny)


def mask_host(mask: str) -> str:
    """`mask` when it can be a Host header (with `${PORT}` standing for a port); else InvalidRequest."""
    host, port = _split_host_port(mask)
    if not host.isascii():
        raise InvalidRequest(f"mask request host '{host}' is not ASCII. Please use ASCII characters only.")
    sample_host = host.replace(_PORT_PLACEHOLDER, "1")
    sample_port = port.replace(_PORT_PLACEHOLDER, "1") if port is not None else "1"
    labels = sample_host.removesuffix(".").split(".")
    if not all(_LABEL.fullmatch(label) for label in labels) or not _is_port(sample_port):
        raise InvalidRequest(f"mask request host is not valid: {mask}")
    return mask


def https_ports(ports: Sequence[int]) -> tuple[int, ...]:
    """E2B's `httpsPorts`, sorted and each once; InvalidRequest for a port out of range, envd's (which serves
    plain HTTP), or more than `MAX_HTTPS_PORTS`."""
    for port in ports:
        if not 1 <= port <= 65535:
            raise InvalidRequest(f"invalid https port {port}: ports are 1 to 65535")
        if port == ENVD_PORT:
            raise InvalidRequest(f"the envd port ({ENVD_PORT}) cannot be listed in httpsPorts")
    listed = tuple(sorted(set(ports)))
    if len(listed) > MAX_HTTPS_PORTS:
        raise InvalidRequest(f"httpsPorts lists {len(listed)} ports; at most {MAX_HTTPS_PORTS} may be listed")
    return listed


def check_private_ingress(*, public: bool, secure: bool) -> None:
    """E2B refuses private ports on a sandbox whose envd accepts any caller: its token would guard nothing."""
    if not public and not secure:
        raise InvalidRequest(_PRIVATE_NEEDS_SECURE)


def _address(entry: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address of an IP or CIDR as Go's `net.ParseIP` / `net.ParseCIDR` take them; None for anything else."""
    text, slash, prefix = entry.partition("/")
    if "%" in text:  # a zone: Python takes `fe80::1%eth0`, Go does not
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if slash and not (prefix.isascii() and prefix.isdigit() and int(prefix) <= address.max_prefixlen):
        return None
    return address


def _specified_address(entry: str) -> bool:
    """An IP or CIDR whose address is not 0.0.0.0 or :: (nftables refuses those), or E2B's ALL_TRAFFIC."""
    address = _address(entry)
    return address is not None and (entry == E2B_ALL_TRAFFIC or not address.is_unspecified)


def _split_host_port(mask: str) -> tuple[str, str | None]:
    """Host and port as Go's `net.SplitHostPort` splits them (no port: all of it is the host). A bracketed or
    many-coloned mask is an IPv6 literal at best, which no host check lets through, so it is refused here."""
    if "[" in mask or "]" in mask or mask.count(":") > 1:
        raise InvalidRequest(f"mask request host is not valid: {mask}")
    host, colon, port = mask.partition(":")
    return host, port if colon else None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 1 <= int(text) <= 65535
