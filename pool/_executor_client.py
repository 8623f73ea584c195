"""The few calls the control plane makes to a sandbox's executor, over a socket the runtime opened."""

from __future__ import annotations

import asyncio
import base64
import socket
import struct
import urllib.parse

import httptools
import msgspec

from pool._errors import RuntimeFailure
from pool._runtime import ExecutorInit

__all__ = ["EXECUTOR_PORT", "post_init", "read_file", "start_process"]

EXECUTOR_PORT = 49983  # fixed by E2B's envd protocol, in every runtime
_encoder = msgspec.json.Encoder()
_TIMEOUT = 10.0
_END_STREAM = 0x02  # Connect envelope flag: the trailer (an error, or nothing) follows


class _Command(msgspec.Struct, kw_only=True):
    cmd: str
    args: list[str]


class _StartRequest(msgspec.Struct, kw_only=True):
    process: _Command
    tag: str
    stdin: bool = False


class _StartEvent(msgspec.Struct):
    pid: int


class _Event(msgspec.Struct):
    start: _StartEvent | None = None


class _Message(msgspec.Struct):
    event: _Event | None = None


_message = msgspec.json.Decoder(_Message)


async def post_init(sock: socket.socket, init: ExecutorInit, current_token: str | None) -> None:
    """Apply env vars, access token and default user to a running executor (envd's `POST /init`)."""
    head = "POST /init HTTP/1.1\r\nContent-Type: application/json\r\n"
    status, body = await _exchange(sock, head, _encoder.encode(init), current_token, first_envelope=False)
    if not 200 <= status < 300:
        raise RuntimeFailure(f"executor refused POST /init: {status} {body[:300].decode(errors='replace')}")


async def start_process(sock: socket.socket, command: str, *, tag: str, user: str, token: str | None) -> int:
    """Start `bash -l -c command` as `user` in the background (process.Process/Start); return its pid inside.

    Only the stream's first message (`start{pid}`) is read: closing the stream leaves the process running,
    with no deadline, reachable by its `tag` like any other process of the sandbox.
    """
    message = _encoder.encode(_StartRequest(process=_Command(cmd="/bin/bash", args=["-l", "-c", command]), tag=tag))
    auth = base64.b64encode(f"{user}:".encode()).decode()
    head = (
        "POST /process.Process/Start HTTP/1.1\r\nContent-Type: application/connect+json\r\n"
        f"Connect-Protocol-Version: 1\r\nAuthorization: Basic {auth}\r\n"
    )
    body = struct.pack(">BI", 0, len(message)) + message
    status, first = await _exchange(sock, head, body, token, first_envelope=True)
    event = None
    if status == 200 and first and not first[0] & _END_STREAM:
        try:
            event = _message.decode(first[5:]).event
        except msgspec.DecodeError as exc:
            raise RuntimeFailure(f"executor sent a bad start event: {first[:300]!r}") from exc
    if event is None or event.start is None:
        raise RuntimeFailure(f"executor did not start {command!r}: {status} {first[:300].decode(errors='replace')}")
    return event.start.pid


async def read_file(sock: socket.socket, path: str, *, user: str, token: str | None, limit: int) -> bytes | None:
    """A file's content (envd's `GET /files`, `path` relative to `user`'s home), or None when it does not exist.

    RuntimeFailure when the executor refuses, or the file is larger than `limit` bytes (nothing more is read).
    """
    query = urllib.parse.urlencode({"path": path, "username": user})
    head = f"GET /files?{query} HTTP/1.1\r\n"
    status, body = await _exchange(sock, head, b"", token, first_envelope=False, limit=limit)
    if status == 404:
        return None
    if status != 200:
        raise RuntimeFailure(f"executor refused GET /files {path}: {status} {body[:300].decode(errors='replace')}")
    return body


class _FirstEnvelope:
    """httptools callbacks: the body's first Connect envelope (5-byte header + message), or the whole body."""

    def __init__(self, envelope: bool) -> None:
        self.envelope = envelope
        self.body = bytearray()
        self.done = False

    def on_body(self, data: bytes) -> None:
        self.body += data
        if self.envelope and len(self.body) >= 5:
            self.done = len(self.body) >= 5 + struct.unpack(">I", self.body[1:5])[0]

    def on_message_complete(self) -> None:
        self.done = True


async def _exchange(
    sock: socket.socket, head: str, body: bytes, token: str | None, *, first_envelope: bool, limit: int = 1 << 20
) -> tuple[int, bytes]:
    """Send one request and read its status and its body (or the body's first envelope), bounded in time and
    to `limit` bytes of body."""
    token_line = f"X-Access-Token: {token}\r\n" if token else ""
    request = f"{head}Host: executor\r\n{token_line}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    reader, writer = await asyncio.open_connection(sock=sock)
    collector = _FirstEnvelope(first_envelope)
    parser = httptools.HttpResponseParser(collector)
    try:
        async with asyncio.timeout(_TIMEOUT):
            writer.write(request.encode() + body)
            while not collector.done and (chunk := await reader.read(65536)):
                parser.feed_data(chunk)
                if len(collector.body) > limit:
                    raise RuntimeFailure(f"executor answered {head.split(' ', 2)[1]} with more than {limit} bytes")
    except (OSError, TimeoutError, httptools.HttpParserError) as exc:
        raise RuntimeFailure(f"executor did not answer {head.split(' ', 2)[1]}: {exc!r}") from exc
    finally:
        writer.close()
    return parser.get_status_code(), bytes(collector.body)
