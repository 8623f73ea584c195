"""TCP ports of the real node's namespace, reachable on the machine's loopback (`python -m kube_dev bridge`).

A listener on 127.0.0.1:<port> here, and for each connection a socket made inside the node's network
namespace (setns for the one `socket()` call, then back), connected to 127.0.0.1:<port> there or to any
address there (a pod's): a socket keeps the namespace it was made in. So kubectl, the tests and the E2B SDK
reach the apiserver and a gateway run in the namespace as if they were local, with no interface, route or
rule added to the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from kube_dev._node_namespace import enter_net

__all__ = ["Forward", "parse_forward", "serve_bridge"]

_CHUNK = 256 * 1024


def _socket_in(node_ns: int, own_ns: int) -> socket.socket:
    enter_net(node_ns)
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    finally:
        enter_net(own_ns)
    sock.setblocking(False)
    return sock


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()


Forward = tuple[int, str, int]  # the port here, and the address and port in the node's namespace


def parse_forward(text: str) -> Forward:
    """`PORT` (the same port on the namespace's loopback) or `PORT:HOST:PORT` (a pod's address, say)."""
    port, _, target = text.partition(":")
    host, _, target_port = target.rpartition(":")
    if not target:
        return int(port), "127.0.0.1", int(port)
    return int(port), host, int(target_port)


async def _serve(holder: int, forwards: list[Forward], ready_file: Path | None) -> None:
    node_ns = os.open(f"/proc/{holder}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    own_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    loop = asyncio.get_running_loop()

    def handler(host: str, port: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                sock = _socket_in(node_ns, own_ns)
            except OSError:  # the namespace is gone
                writer.transport.abort()
                return
            try:
                await loop.sock_connect(sock, (host, port))
            except OSError:
                sock.close()
                writer.transport.abort()
                return
            inner_reader, inner_writer = await asyncio.open_connection(sock=sock)
            await asyncio.gather(_pump(reader, inner_writer), _pump(inner_reader, writer))
            for w in (writer, inner_writer):
                w.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await w.wait_closed()

        return forward

    servers = [await asyncio.start_server(handler(host, port), "127.0.0.1", here) for here, host, port in forwards]
    if ready_file is not None:
        await asyncio.to_thread(ready_file.write_text, f"{os.getpid()}\n")
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        await stop.wait()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_signal_handler(signal.SIGINT)
        for server in servers:
            server.close()


def serve_bridge(holder: int, forwards: list[Forward], ready_file: Path | None = None) -> int:
    """Forward each port of this machine's loopback into the holder's namespace until SIGTERM; `ready_file` is
    written once every port listens (a port taken here ends it with OSError first)."""
    asyncio.run(_serve(holder, forwards, ready_file))
    return 0
