"""The helper process that runs file operations as one user (`_as_user` starts it, `_fs_ops` is what it runs).

It serves one call at a time on the socket it gets as stdin, until the socket closes. Both ways a
message is one frame: `HEADER` (a status byte and the payload's length) then the payload, msgpack.

    request   status 0, [op name, [arguments...]]
    reply     OK, the op's result (a `Descriptor` result's fd goes along as SCM_RIGHTS, then is closed here)
              FAILED, [ExecutorError class name, message]
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

import msgspec

__all__ = ("FAILED", "HEADER", "OK", "main", "serve")

HEADER = struct.Struct(">BI")
OK, FAILED = 0, 1
_request = msgspec.msgpack.Decoder(tuple[str, list[Any]])
_encode = msgspec.msgpack.Encoder().encode


def main() -> None:
    """The helper's entry point: serve the socket on fd 0."""
    serve(socket.socket(fileno=0))


def serve(sock: socket.socket) -> None:
    from executor._errors import ExecutorError
    from executor._fs_ops import OPS, Descriptor

    while (payload := _read_frame(sock)) is not None:
        fds: list[int] = []
        try:
            name, args = _request.decode(payload)
            result = OPS[name](*args)
        except ExecutorError as exc:
            status, body = FAILED, _encode((type(exc).__name__, exc.message))
        except Exception as exc:  # a bug or a malformed request: the executor reports it as internal
            status, body = FAILED, _encode(("Internal", f"file helper error: {type(exc).__name__}: {exc}"))
        else:
            if isinstance(result, Descriptor):
                fds.append(result.fd)
            status, body = OK, _encode(result)
        try:
            _send_frame(sock, status, body, fds)
        finally:
            for fd in fds:
                os.close(fd)


def _read_frame(sock: socket.socket) -> bytes | None:
    header = _read_exactly(sock, HEADER.size)
    if header is None:
        return None
    return _read_exactly(sock, HEADER.unpack(header)[1])


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _send_frame(sock: socket.socket, status: int, body: bytes, fds: list[int]) -> None:
    data = HEADER.pack(status, len(body)) + body
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else []
    sent = sock.sendmsg([data], ancillary)
    if sent < len(data):  # never sendall(b""): it would still send, and fail once the executor has the reply
        sock.sendall(data[sent:])
