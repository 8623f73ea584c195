"""Run a command in a sandbox through its executor, straight over a runtime socket (no gateway, no API).

Runtime tests use this so that they test the runtime and the executor, and nothing above them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
from typing import Protocol

import httptools
import msgspec

__all__ = ["CommandResult", "SocketOpener", "run_in_sandbox"]


class SocketOpener(Protocol):
    """The one runtime call this needs (every `pool.Runtime` has it)."""

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket: ...


class CommandResult(msgspec.Struct, frozen=True):
    exit_code: int
    stdout: str
    stderr: str


class _Collector:
    """httptools callbacks: collects the (de-chunked) body and notices its end."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.status = 0
        self.done = asyncio.Event()

    def on_body(self, data: bytes) -> None:
        self.body += data

    def on_message_complete(self) -> None:
        self.done.set()


def _envelopes(data: bytes) -> list[tuple[int, dict[str, object]]]:
    out, pos = [], 0
    while pos + 5 <= len(data):
        flags, size = struct.unpack(">BI", data[pos : pos + 5])
        out.append((flags, json.loads(data[pos + 5 : pos + 5 + size])))
        pos += 5 + size
    return out


async def run_in_sandbox(
    runtime: SocketOpener, sandbox_id: str, command: str, *, user: str = "user", token: str | None = None
) -> CommandResult:
    """Run `bash -l -c command` as `user` and collect its output and exit code."""
    message = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}, "stdin": False}).encode()
    body = struct.pack(">BI", 0, len(message)) + message
    auth = base64.b64encode(f"{user}:".encode()).decode()
    head = (
        "POST /process.Process/Start HTTP/1.1\r\nHost: sandbox\r\nContent-Type: application/connect+json\r\n"
        f"Connect-Protocol-Version: 1\r\nAuthorization: Basic {auth}\r\n"
        + (f"X-Access-Token: {token}\r\n" if token else "")
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(sock=await runtime.open_socket(sandbox_id, 49983))
    collector = _Collector()
    parser = httptools.HttpResponseParser(collector)
    writer.write(head + body)
    try:
        while not collector.done.is_set() and (chunk := await reader.read(65536)):
            parser.feed_data(chunk)
    finally:
        writer.close()
    stdout, stderr, exit_code = b"", b"", None
    for flags, msg in _envelopes(bytes(collector.body)):
        if flags & 2:
            assert "error" not in msg, msg
            continue
        event = msg["event"]
        assert isinstance(event, dict)
        data = event.get("data") or {}
        stdout += base64.b64decode(data.get("stdout", ""))
        stderr += base64.b64decode(data.get("stderr", ""))
        if "end" in event:
            exit_code = int(event["end"].get("exitCode", 0))
    assert exit_code is not None, f"no end event: {collector.body!r}"
    return CommandResult(exit_code, stdout.decode(errors="replace"), stderr.decode(errors="replace"))
