"""Byte relay between a sandbox's redirected connection and the host's connection to where it was going.

The bytes never enter Python: `splice(2)` moves them socket → pipe → socket inside the kernel, and the event
loop only waits for readiness. A relay that copied through `recv`/`send` reached about 40 % of loopback's
throughput in the lab (`local-runtime-lab.md` §5); splice keeps within the target of 80 % of the host's own
(loadtests/bench_network.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import struct

__all__ = ["original_destination", "relay", "reset"]

_SO_ORIGINAL_DST = 80  # netfilter's getsockopt for the pre-DNAT destination (IP6T_SO_ORIGINAL_DST is the same)
_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1 << 20  # fs.pipe-max-size's default: fewer wake-ups per MiB than the 64 KiB default
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


def original_destination(conn: socket.socket) -> tuple[str, int]:
    """Where the sandbox was connecting to before its nftables table redirected it to us."""
    if conn.family == socket.AF_INET6:
        raw = conn.getsockopt(socket.IPPROTO_IPV6, _SO_ORIGINAL_DST, 28)
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), struct.unpack_from("!H", raw, 2)[0]
    raw = conn.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    return socket.inet_ntop(socket.AF_INET, raw[4:8]), struct.unpack_from("!H", raw, 2)[0]


def reset(sock: socket.socket) -> None:
    """Close with a RST, so the other end learns at once that the connection is gone."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until both sides have finished sending; then close both (RST if one broke)."""
    try:
        await asyncio.gather(_pump(a, b), _pump(b, a))
    except (OSError, asyncio.CancelledError):
        reset(a)
        reset(b)
        raise
    a.close()
    b.close()


async def _pump(src: socket.socket, dst: socket.socket) -> None:
    """src → dst until src's end of stream, which is passed on as a half close."""
    loop = asyncio.get_running_loop()
    pipe_r, pipe_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(pipe_w, _F_SETPIPE_SZ, _PIPE_BYTES)
        while True:
            try:
                pending = os.splice(src.fileno(), pipe_w, _PIPE_BYTES, flags=_FLAGS)
            except BlockingIOError:
                await _ready(loop, src.fileno(), write=False)
                continue
            if pending == 0:
                break
            while pending:
                try:
                    pending -= os.splice(pipe_r, dst.fileno(), pending, flags=_FLAGS)
                except BlockingIOError:
                    await _ready(loop, dst.fileno(), write=True)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
    finally:
        os.close(pipe_r)
        os.close(pipe_w)


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    waiter = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await waiter
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)
