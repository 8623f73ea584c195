"""Sockets created inside a sandbox's network namespace, so the gateway needs no veth and no addresses.

The network namespace is per thread: we switch the calling thread in, create the socket, and switch back.
That takes microseconds (`local-runtime-lab.md` §5) and the socket belongs to the sandbox's namespace for
good, so a server bound to 127.0.0.1 inside is reachable.
"""

from __future__ import annotations

import os
import socket

from pool._local._syscalls import CLONE_NEWNET, setns

__all__ = ["NetnsSocketFactory"]


class NetnsSocketFactory:
    """Creates TCP sockets in other network namespaces and returns to the host's afterwards."""

    def __init__(self) -> None:
        self._host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    def socket_in(self, netns_fd: int) -> socket.socket:
        setns(netns_fd, CLONE_NEWNET)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            setns(self._host_fd, CLONE_NEWNET)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def close(self) -> None:
        os.close(self._host_fd)
