"""Ports inside a sandbox reached through the gateway, by Host name and by WebSocket."""

from __future__ import annotations

import httpx
import pytest
import websockets
from e2b import Sandbox

from tests.server_fixtures import RunningServer, wait_for_port

pytestmark = pytest.mark.anyio

_WS_ECHO = r"""
# A stdlib-only WebSocket echo server (the sandbox has no network to install one).
import base64, hashlib, socket, struct, threading

def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data

def serve(conn):
    head = b""
    while b"\r\n\r\n" not in head:
        head += conn.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    try:
        while True:
            b0, b1 = recv_exact(conn, 2)
            size = b1 & 0x7F
            if size == 126:
                size = struct.unpack(">H", recv_exact(conn, 2))[0]
            elif size == 127:
                size = struct.unpack(">Q", recv_exact(conn, 8))[0]
            mask = recv_exact(conn, 4)
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(recv_exact(conn, size)))
            opcode = b0 & 0x0F
            if opcode == 8:
                conn.sendall(b"\x88\x02" + payload[:2])
                return
            header = bytes([0x80 | opcode]) + (bytes([size]) if size < 126 else b"\x7e" + struct.pack(">H", size))
            conn.sendall(header + payload)
    except EOFError:
        pass
    finally:
        conn.close()

listener = socket.create_server(("127.0.0.1", 8765))
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def test_server_on_loopback_inside_is_served_by_host_name(sbx: Sandbox, e2b_env: RunningServer) -> None:
    sbx.files.write("/home/user/site/index.html", "<h1>hi from the sandbox</h1>")
    sbx.commands.run("cd /home/user/site && python3 -m http.server 8008 --bind 127.0.0.1", background=True)
    wait_for_port(sbx, 8008)
    host = sbx.get_host(8008)
    assert host == f"8008-{sbx.sandbox_id}.sandbox.localhost"
    response = httpx.get(f"http://{host}:{e2b_env.port}/index.html")  # *.localhost resolves to loopback
    assert response.status_code == 200
    assert response.text == "<h1>hi from the sandbox</h1>"


def test_closed_port_and_unknown_sandbox_answer_502_in_e2b_shape(sbx: Sandbox, e2b_env: RunningServer) -> None:
    closed = httpx.get(e2b_env.url, headers={"Host": f"9999-{sbx.sandbox_id}.sandbox.localhost"})
    assert closed.status_code == 502
    assert "port is not open" in closed.json()["message"]
    unknown = httpx.get(e2b_env.url, headers={"Host": "9999-doesnotexist000000000.sandbox.localhost"})
    assert unknown.status_code == 502
    assert "was not found" in unknown.json()["message"]


async def test_websocket_echo_inside_is_reached_through_the_gateway(sbx: Sandbox, e2b_env: RunningServer) -> None:
    sbx.files.write("/home/user/echo.py", _WS_ECHO)
    sbx.commands.run("python3 /home/user/echo.py", background=True)
    wait_for_port(sbx, 8765)

    async def talk() -> list[str | bytes]:
        async with websockets.connect(f"ws://{sbx.get_host(8765)}:{e2b_env.port}/") as ws:
            await ws.send("text frame")
            await ws.send(b"\x00binary")
            return [await ws.recv(), await ws.recv()]

    assert await talk() == ["text frame", b"\x00binary"]
