"""Shared by the scale-to-zero end-to-end tests: a counting server to run in a sandbox, raw clients that count
what they get back, and helpers to read the server's metrics and wait for a sandbox's state."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from typing import Any, NamedTuple

import httpx
import pytest
from e2b import Sandbox

from tests.polling import wait_for
from tests.server_fixtures import RunningServer

COUNTER_PORT = 8000

# Counts every HTTP request (by path) and every WebSocket upgrade (by path) in memory; GET /count reports both.
# asyncio and a 4096-connection backlog, so a burst after a restore is accepted at once; stdlib only (the
# sandbox has no network). An 8 MiB heap makes "memory survived" mean something.
COUNTER = r"""
import asyncio, base64, hashlib, json, sys
hits, upgrades, heap = {}, {}, bytearray(b"x" * (8 << 20))
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

async def websocket(key, headers, reader, writer):
    upgrades[key] = upgrades.get(key, 0) + 1
    accept = base64.b64encode(hashlib.sha1(headers[b"sec-websocket-key"] + GUID).digest())
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    message = key.encode()
    writer.write(bytes([0x81, len(message)]) + message + b"\x88\x02\x03\xe8")  # one text frame, then close 1000
    await writer.drain()
    await reader.read(4096)  # the client's close frame, or its EOF

async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            path = lines[0].split(b" ")[1].decode()
            pairs = (line.split(b":", 1) for line in lines[1:] if b":" in line)
            headers = {name.strip().lower(): value.strip() for name, value in pairs}
            if headers.get(b"upgrade", b"").lower() == b"websocket":
                await websocket(path, headers, reader, writer)
                return
            if path == "/count":
                body = json.dumps({"hits": hits, "upgrades": upgrades, "heap": len(heap)}).encode()
            else:
                hits[path] = hits.get(path, 0) + 1
                body = f"{path} {hits[path]}".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


class Reply(NamedTuple):
    status: int
    body: bytes
    headers: dict[str, str]


def start_counter(sbx: Sandbox, port: int = COUNTER_PORT) -> None:
    """Start the counting server in the background (detached: it outlives the command) and wait for its port."""
    sbx.files.write("/home/user/counter.py", COUNTER)
    sbx.commands.run(
        f"setsid python3 /home/user/counter.py {port} </dev/null >/home/user/counter.log 2>&1 & "
        f"for i in $(seq 200); do (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && exit 0; sleep 0.05; done; exit 1"
    )


def host(sbx_id: str, port: int = COUNTER_PORT) -> str:
    return f"{port}-{sbx_id}.sandbox.localhost"


async def http_get(gateway_port: int, sandbox_id: str, path: str, *, port: int = COUNTER_PORT) -> Reply:
    """One GET through the gateway on a fresh connection (raw, so nothing is retried or pooled)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway_port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host(sandbox_id, port)}\r\nConnection: close\r\n\r\n".encode())
        return _parse(await reader.read())
    finally:
        writer.close()


def _parse(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    return Reply(int(lines[0].split()[1]), body, headers)


async def burst(gateway_port: int, sandbox_id: str, http: int, websockets: int) -> tuple[list[Reply], list[bytes]]:
    """Open every connection first, then send every request at once: the burst lands within milliseconds.

    Returns the HTTP replies (path /hit/<i>) and, per WebSocket (path /ws/<i>), the text of the one frame got.
    """
    conns = await asyncio.gather(
        *(asyncio.open_connection("127.0.0.1", gateway_port) for _ in range(http + websockets))
    )
    go = asyncio.Event()

    async def one_http(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Reply:
        await go.wait()
        writer.write(f"GET /hit/{i} HTTP/1.1\r\nHost: {host(sandbox_id)}\r\nConnection: close\r\n\r\n".encode())
        try:
            return _parse(await reader.read())
        finally:
            writer.close()

    async def one_ws(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        await go.wait()
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET /ws/{i} HTTP/1.1\r\nHost: {host(sandbox_id)}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                return head.split(b"\r\n", 1)[0]
            first, size = await reader.readexactly(2)
            text = await reader.readexactly(size & 0x7F)
            mask = os.urandom(4)
            writer.write(b"\x88\x82" + mask + bytes(b ^ mask[i] for i, b in enumerate(b"\x03\xe8")))  # close 1000
            return text if first == 0x81 else b"bad frame"
        finally:
            writer.close()

    tasks = [one_http(i, *conns[i]) for i in range(http)]
    ws_tasks = [one_ws(i, *conns[http + i]) for i in range(websockets)]
    running = asyncio.gather(asyncio.gather(*tasks), asyncio.gather(*ws_tasks))
    await asyncio.sleep(0)
    go.set()
    replies, frames = await running
    return list(replies), list(frames)


async def health_burst(gateway_port: int, sandbox_id: str, count: int) -> list[Reply]:
    """`count` GETs of the executor's /health through the gateway, on connections opened first and sent at once
    (the executor is what answers after a resume of any runtime, with nothing started in the sandbox)."""
    conns = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", gateway_port) for _ in range(count)))
    request = f"GET /health HTTP/1.1\r\nHost: {host(sandbox_id, 49983)}\r\nConnection: close\r\n\r\n".encode()
    go = asyncio.Event()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Reply:
        await go.wait()
        writer.write(request)
        try:
            return _parse(await reader.read())
        finally:
            writer.close()

    replies = asyncio.gather(*(one(*conn) for conn in conns))
    await asyncio.sleep(0)
    go.set()
    return list(await replies)


def counted(server: RunningServer, sandbox_id: str) -> dict[str, Any]:
    """What the counting server in the sandbox counted (through the gateway)."""
    reply = httpx.get(f"{server.url}/count", headers={"Host": host(sandbox_id)}, timeout=30)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = json.loads(reply.text)
    return result


def metric(server: RunningServer, name: str, **labels: str) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    wanted = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    for line in httpx.get(f"{server.url}/metrics", headers={"X-API-Key": server.api_key}).text.splitlines():
        if line.startswith(f"{name}{wanted} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def sandboxes_by_state(server: RunningServer) -> dict[str, int]:
    state: dict[str, int] = httpx.get(f"{server.url}/health").json()["sandboxes"]
    return state


def criu_or_skip(server: RunningServer) -> None:
    """Skip (fail under CI=true) unless the server's runtime checkpoints memory with CRIU."""

    def reported() -> dict[str, str]:
        answer: dict[str, str] = httpx.get(f"{server.url}/health").json().get("runtime", {})
        return answer

    wait_for(lambda: "still running" not in reported().get("criu_reason", ""), what="the server's CRIU trial")
    runtime = reported()
    if runtime.get("snapshot_kind") != "criu":
        reason = f"snapshots keep files only here: {runtime.get('criu_reason')}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CRIU must work in CI (run scripts/build-criu): {reason}")
        pytest.skip(reason)
