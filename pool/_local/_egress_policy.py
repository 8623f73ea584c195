"""What one sandbox may reach: E2B's allow/deny rules over the ranges no sandbox ever reaches.

The same decision is made twice. The sandbox's own nftables table (`ruleset`) rejects what is denied at
`connect()` (ECONNREFUSED at once, no hang) and sends everything else to the host's egress proxy, which
checks again (`allows`) before it dials: the proxy is the only way out of the namespace, so the rules hold
even against a sandbox that got a packet past its table. Domain rules can only be checked by the proxy (on
the name the connection sends, `_egress_names`): with them, TCP that no address rule allows goes to the
proxy too, and is reset there unless its name is allowed.

Order (E2B's): always denied > allowed > denied > the default (allowed unless `deny_out` covers all).
DNS (UDP and TCP port 53, any address) goes to the host's forwarder. A sandbox without internet (E2B's
`allow_internet_access=false`, and warm sandboxes before their claim) reaches nothing, names included: its
table rejects everything but loopback, or, when it never had internet, it has no route at all (ENETUNREACH).
"""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Iterable

from pool._local._egress_names import domain_matches
from pool._runtime import EgressRules

__all__ = ["ALWAYS_DENIED", "DNS_ADDRESS", "PROXY_PORT", "EgressPolicy", "host_addresses"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Private, shared, loopback, link-local (cloud metadata), multicast and reserved ranges of both families, and
# IPv4-mapped IPv6 (the same addresses again).
ALWAYS_DENIED = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.168.0.0/16", "224.0.0.0/3",
    "::/128", "::1/128", "::ffff:0:0/96", "fc00::/7", "fe80::/10", "ff00::/8",
)  # fmt: skip
# Inside every sandbox: where its DNS queries are answered and where its TCP connections are redirected.
# Both are the host's own sockets, made in the sandbox's namespace before its first process runs.
DNS_ADDRESS = "127.0.0.53"
PROXY_PORT = 1


class EgressPolicy:
    """One sandbox's rules, parsed once: for its nftables table and for the proxy's per-connection check."""

    def __init__(self, rules: EgressRules, *, always_denied: Iterable[str]) -> None:
        self.rules = rules
        self.domains = rules.domains
        self._always = _networks(always_denied)
        self._allow = _networks(rules.allowed_networks)
        self._deny = _networks(rules.deny_out)
        self._default_allows = rules.internet and not self._covers_all(self._deny)

    def blocks(self, address: str) -> bool:
        """Whether `address` is one no sandbox ever reaches (whatever its rules, domains included)."""
        return _within(_ip(address), self._always)

    def allows(self, address: str) -> bool:
        """Whether the proxy may dial `address` for this sandbox, going by addresses alone."""
        ip = _ip(address)
        if _within(ip, self._always):
            return False
        if _within(ip, self._allow):
            return True
        return not _within(ip, self._deny) and self._default_allows

    def allows_name(self, name: str) -> bool:
        """Whether a connection naming `name` (SNI, Host) may go to what the name resolves to."""
        return domain_matches(name, self.domains)

    @property
    def internet(self) -> bool:
        """Whether anything outside is reachable (else the sandbox needs no route, no proxy and no DNS)."""
        return self.rules.internet

    def ruleset(self, table: str, *, replace: bool, mark: int = 0) -> str:
        """The sandbox's nftables table; `replace` swaps it for the one there in the same transaction.

        One rule per verdict with an anonymous set of collapsed CIDRs: creating the table takes ~1 ms, named
        interval sets took 8-16 ms (loadtests/bench_network.py). Replacing costs ~10 ms more (the kernel waits
        out an RCU grace period for the old table): that is `set_egress`, never a start.

        `mark`: the proxy shares the namespace (a Kubernetes pod's egress guard), so its own packets, which carry
        `mark`, go out untouched, and so do the answers of connections made to the sandbox from outside (the
        gateway's, the kubelet's probes), which a pod has and a local sandbox does not.
        """
        shared = _SHARED.format(mark=mark) if mark else ""
        if not self.internet:
            verdicts = f"{shared}\t\t{_REJECT_TCP}\n\t\t{_REJECT_OTHER}\n"
            return _prefix(table, replace) + _TABLE.format(table=table, verdicts=verdicts, divert="")
        verdicts = shared + _DNS + f"\t\tmeta l4proto != tcp {_REJECT_OTHER}\n"
        # With domain rules, TCP the addresses do not allow still goes to the proxy, which reads the name.
        denied = [] if self.domains else [(self._deny, _REJECT_TCP)]
        for networks, verdict in ((self._always, _REJECT_TCP), (self._allow, "accept"), *denied):
            verdicts += "".join(_match(networks, version, verdict) for version in (4, 6))
        if not self._default_allows and not self.domains:
            verdicts += f"\t\t{_REJECT_TCP}\n"
        divert = _DIVERT.format(
            dns=DNS_ADDRESS, port=PROXY_PORT, own=f"\t\tmeta mark {mark:#x} return\n" if mark else ""
        )
        return _prefix(table, replace) + _TABLE.format(table=table, verdicts=verdicts, divert=divert)

    @staticmethod
    def _covers_all(networks: list[IPNetwork]) -> bool:
        return {str(n) for n in networks if n.prefixlen == 0} >= {"0.0.0.0/0", "::/0"}


_REJECT_TCP = "meta l4proto tcp reject with tcp reset"
# DNS to any address goes to the forwarder, over TCP too (glibc's fallback for a truncated answer, to a resolver
# that is often a private address: a pod's cluster DNS).
_DNS = "\t\tmeta nfproto ipv4 udp dport 53 accept\n\t\tmeta nfproto ipv4 tcp dport 53 accept\n"
_SHARED = "\t\tmeta mark {mark:#x} accept\n\t\tct direction reply ct state established,related accept\n"
_REJECT_OTHER = "reject with icmpx admin-prohibited"
_TABLE = """table inet {table} {{
\tchain guard {{
\t\ttype filter hook output priority -150; policy accept;
\t\tip daddr 127.0.0.0/8 accept
\t\tip6 daddr ::1 accept
{verdicts}\t}}
{divert}}}
"""
_DIVERT = """\tchain divert {{
\t\ttype nat hook output priority -100; policy accept;
\t\tip daddr 127.0.0.0/8 return
\t\tip6 daddr ::1 return
{own}\t\tmeta nfproto ipv4 udp dport 53 dnat ip to {dns}:53
\t\tmeta nfproto ipv4 tcp dport 53 dnat ip to {dns}:53
\t\tmeta nfproto ipv4 meta l4proto tcp dnat ip to 127.0.0.1:{port}
\t\tmeta nfproto ipv6 meta l4proto tcp dnat ip6 to [::1]:{port}
\t}}
"""


def _prefix(table: str, replace: bool) -> str:
    return f"add table inet {table}\ndelete table inet {table}\n" if replace else ""


def _match(networks: list[IPNetwork], version: int, verdict: str) -> str:
    """`ip daddr { … } verdict` for the networks of one family, overlaps merged; "" when there are none."""
    ours = [n for n in networks if n.version == version]
    if not ours:
        return ""
    merged = ", ".join(str(n) for n in ipaddress.collapse_addresses(ours))  # type: ignore[type-var]
    return f"\t\t{'ip' if version == 4 else 'ip6'} daddr {{ {merged} }} {verdict}\n"


def _networks(entries: Iterable[str]) -> list[IPNetwork]:
    return [ipaddress.ip_network(entry, strict=False) for entry in entries]


def _ip(address: str) -> IPAddress:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _within(ip: IPAddress, networks: list[IPNetwork]) -> bool:
    return any(ip.version == n.version and ip in n for n in networks)


def host_addresses() -> list[str]:
    """This machine's own addresses (blocking, cheap): from the kernel's local routes and IPv6 address list."""
    found: set[str] = set()
    try:
        with open("/proc/net/fib_trie") as f:
            lines = f.read().splitlines()
        for previous, line in itertools.pairwise(lines):
            if line.strip() == "/32 host LOCAL":
                found.add(previous.split()[-1])
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                raw = line.split()[0]
                found.add(str(ipaddress.IPv6Address(bytes.fromhex(raw))))
    except OSError:
        pass
    return sorted(found)
