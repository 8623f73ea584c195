"""Calls both the sandboxes' runtime and the warm pools make: a DELETE that lets a missing object be, and a
connection to a pod's port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping

from pool._errors import PortClosed, RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError

__all__ = ["connect", "delete"]


async def delete(api: KubeApi, path: str, *, params: Mapping[str, str] | None = None) -> None:
    """DELETE `path`; an object already gone (404) is no error."""
    try:
        await api.call("DELETE", path, params=params)
    except KubeApiError as exc:
        if exc.status != 404:
            raise


async def connect(ip: str, port: int, within: float, what: str) -> socket.socket:
    """A connected, non-blocking TCP socket to `port` at a pod's IP; the errors name the pod as `what`."""
    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(within):
            await asyncio.get_running_loop().sock_connect(sock, (ip, port))
    except ConnectionRefusedError as exc:
        sock.close()
        raise PortClosed(f"nothing listens on port {port} of {what}") from exc
    except (OSError, TimeoutError) as exc:
        sock.close()
        raise RuntimeFailure(f"cannot connect to port {port} of {what} at {ip}: {exc!r}") from exc
    return sock
