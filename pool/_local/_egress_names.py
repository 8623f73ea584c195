"""What a connection really names: the TLS SNI or the HTTP Host of its first bytes, for domain rules.

Domain rules (`allowOut: ["example.com", "*.example.com"]`) are matched against the name the client sends on
the connection, not against what DNS answered, and the proxy then dials that name itself (resolved with the
sandboxes' DNS servers, to addresses no sandbox is denied): pointing a name at another address, or sending an
allowed name to a denied address, reaches only what the allowed name resolves to.
"""

from __future__ import annotations

import ipaddress
import os
import struct

from pool._local._egress_dns import ask

__all__ = ["ClientHelloIncomplete", "domain_matches", "named_host", "resolve"]

_MAX_FIRST_BYTES = 16384


class ClientHelloIncomplete(Exception):
    """More bytes are needed before the connection's name can be known."""


def named_host(first: bytes) -> str | None:
    """The name in a TLS ClientHello's SNI or an HTTP request's Host header; None when there is none.

    Raises `ClientHelloIncomplete` while `first` may still grow into something that names a host.
    """
    if first[:1] == b"\x16":
        return _sni(first)
    end = first.find(b"\r\n\r\n")
    if end < 0:
        if len(first) < _MAX_FIRST_BYTES:
            raise ClientHelloIncomplete
        return None
    for line in first[:end].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"host":
            return _hostname(value.strip().decode("latin-1"))
    return None


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _sni(data: bytes) -> str | None:
    """The server name of a ClientHello (RFC 8446 §4.1.2, RFC 6066 §3)."""
    if len(data) < 5:
        raise ClientHelloIncomplete
    record_end = 5 + struct.unpack_from("!H", data, 3)[0]
    if len(data) < record_end:
        if record_end - 5 > _MAX_FIRST_BYTES:
            return None
        raise ClientHelloIncomplete
    hello = data[5:record_end]
    try:
        if hello[0] != 1:
            return None
        i = 4 + 2 + 32  # handshake header, client version, random
        i += 1 + hello[i]  # session id
        i += 2 + struct.unpack_from("!H", hello, i)[0]  # cipher suites
        i += 1 + hello[i]  # compression methods
        end = i + 2 + struct.unpack_from("!H", hello, i)[0]
        i += 2
        while i + 4 <= end:
            kind, length = struct.unpack_from("!HH", hello, i)
            if kind == 0:  # server_name: list length, name type (0: host_name), name length, name
                size = struct.unpack_from("!H", hello, i + 7)[0]
                return hello[i + 9 : i + 9 + size].decode("ascii")
            i += 4 + length
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


def domain_matches(name: str, patterns: tuple[str, ...]) -> bool:
    """E2B's domain entries: `example.com` is that name, `*.example.com` any name below it, `*` every name."""
    name = name.lower().rstrip(".")
    for pattern in patterns:
        pattern = pattern.lower().rstrip(".")
        if pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


async def resolve(name: str, servers: tuple[str, ...], *, mark: int = 0) -> list[str]:
    """The IPv4 addresses of `name` from the first of `servers` that answers (one A query)."""
    query = os.urandom(2) + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    query += b"".join(bytes([len(label)]) + label for label in name.rstrip(".").encode("idna").split(b".")) + b"\0"
    query += b"\x00\x01\x00\x01"
    for server in servers:
        answer = await ask(server, query, mark=mark)
        if answer is not None:
            return _a_records(answer, len(query))
    return []


def _a_records(answer: bytes, question_end: int) -> list[str]:
    """The A records of a response to our one-question query (names in answers are compressed pointers)."""
    found: list[str] = []
    try:
        count, i = struct.unpack_from("!H", answer, 6)[0], question_end
        for _ in range(count):
            while answer[i] and answer[i] < 0xC0:  # an uncompressed name: skip its labels
                i += 1 + answer[i]
            i += 2 if answer[i] >= 0xC0 else 1
            kind, _, _, length = struct.unpack_from("!HHIH", answer, i)
            if kind == 1 and length == 4:
                found.append(str(ipaddress.IPv4Address(answer[i + 10 : i + 14])))
            i += 10 + length
    except (IndexError, struct.error):
        pass
    return found
