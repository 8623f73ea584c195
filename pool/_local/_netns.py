"""Work inside a sandbox's network namespace from the host: sockets for ingress, the egress set-up.

The network namespace is per thread: we switch the calling thread in, do the work, and switch back. That
takes microseconds (`local-runtime-lab.md` §5). A socket created inside belongs to the sandbox's namespace
for good, so the gateway needs no veth and no addresses, and a server bound to 127.0.0.1 inside is reachable;
the egress proxy's listeners inside the sandbox are made the same way.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from pool._local._syscalls import CLONE_NEWNET, setns

__all__ = ["Namespaces", "NetnsSocketFactory", "SameNamespace"]


class Namespaces(Protocol):
    """How work gets into a sandbox's network namespace (the egress proxy's set-up)."""

    def inside(self, netns_fd: int) -> AbstractContextManager[None]: ...


class SameNamespace:
    """For a proxy that already runs in the sandbox's namespace (a pod's egress guard): nothing to switch."""

    @contextlib.contextmanager
    def inside(self, netns_fd: int) -> Iterator[None]:
        yield


class NetnsSocketFactory:
    """Creates TCP sockets in other network namespaces and returns to the host's afterwards."""

    def __init__(self) -> None:
        self._host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    @contextlib.contextmanager
    def inside(self, netns_fd: int) -> Iterator[None]:
        """Run the block in the namespace of `netns_fd` (this thread only), then back in the host's."""
        setns(netns_fd, CLONE_NEWNET)
        try:
            yield
        finally:
            setns(self._host_fd, CLONE_NEWNET)

    def socket_in(self, netns_fd: int) -> socket.socket:
        with self.inside(netns_fd):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def close(self) -> None:
        os.close(self._host_fd)
