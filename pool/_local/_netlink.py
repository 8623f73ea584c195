"""The one route a sandbox's network namespace needs, added over rtnetlink (no `ip` process per sandbox).

A namespace with loopback only answers `connect()` to any outside address with ENETUNREACH before
netfilter sees the packet. A default route over `lo` with source 127.0.0.1 (and ::1) lets the packet reach
the output hook, where the sandbox's nftables rules either reject it or send it to the host's egress proxy.
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["add_default_routes"]

_RTM_NEWROUTE = 24
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_RT_TABLE_MAIN, _RTPROT_STATIC, _RT_SCOPE_LINK, _RTN_UNICAST = 254, 4, 253, 1
_RTA_OIF, _RTA_PREFSRC = 4, 7
_EEXIST = 17
_LOOPBACK_IFINDEX = 1  # `lo` is always the first interface of a namespace


def add_default_routes() -> None:
    """`default dev lo src 127.0.0.1` and `default dev lo src ::1` in the calling thread's namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl:
        for seq, (family, source) in enumerate(((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")), 1):
            nl.send(_new_route(seq, family, socket.inet_pton(family, source)))
            error = struct.unpack_from("i", nl.recv(4096), 16)[0]  # nlmsgerr.error after the header
            if error and -error != _EEXIST:
                raise OSError(-error, f"adding the sandbox's default route: {os.strerror(-error)}")


def _new_route(seq: int, family: int, source: bytes) -> bytes:
    rtmsg = struct.pack("BBBBBBBBI", family, 0, 0, 0, _RT_TABLE_MAIN, _RTPROT_STATIC, _RT_SCOPE_LINK, _RTN_UNICAST, 0)
    attrs = struct.pack("HHI", 8, _RTA_OIF, _LOOPBACK_IFINDEX) + struct.pack("HH", 4 + len(source), _RTA_PREFSRC)
    body = rtmsg + attrs + source
    flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_EXCL | _NLM_F_CREATE
    return struct.pack("IHHII", 16 + len(body), _RTM_NEWROUTE, flags, seq, 0) + body
