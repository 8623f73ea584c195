"""The executor's WebSocket (`executor._websocket` over `Response.upgrade()`), driven by the `websockets` library.

In-process: the executor's own HTTP server on a loopback socket, a handler that echoes each message back
with its kind, and a real client: messages whole and fragmented, ping, the close handshake, the limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from executor._exchange import Request, Response
from executor._http import Connection
from executor._websocket import MAX_MESSAGE_BYTES, TEXT, Closed, WebSocket, accept_key, is_upgrade

pytestmark = pytest.mark.anyio


async def _echo(request: Request, response: Response) -> None:
    if not is_upgrade(request):
        await response.send(404, b"not a websocket", "text/plain")
        return
    key = request.headers["sec-websocket-key"]
    stream = await response.upgrade(
        (("upgrade", "websocket"), ("connection", "Upgrade"), ("sec-websocket-accept", accept_key(key)))
    )
    ws = WebSocket(stream, response.write_raw)
    with contextlib.suppress(Closed):
        while True:
            kind, payload = await ws.receive()
            if kind == TEXT:
                await ws.send_text(f"text:{payload.decode()}")
            else:
                await ws.send_binary(b"binary:" + payload)


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[str]:
    listener = socket.create_server(("127.0.0.1", 0))
    server = await asyncio.get_running_loop().create_server(lambda: Connection(_echo), sock=listener)
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def test_messages_whole_and_fragmented_come_back_and_ping_is_answered() -> None:
    async with _server() as address, connect(f"ws://{address}/echo", max_size=None) as ws:
        await ws.send("hello")
        assert await ws.recv() == "text:hello"
        await ws.send(b"\x00\x01")
        assert await ws.recv() == b"binary:\x00\x01"
        await ws.send(["frag", "mented"])  # a message in three frames: start, continuation, final
        assert await ws.recv() == "text:fragmented"
        big = b"x" * 70_000  # a 64-bit length
        await ws.send(big)
        assert await ws.recv() == b"binary:" + big
        latency = await ws.ping()
        await asyncio.wait_for(latency, 10)
        await ws.close()
        assert ws.close_code == 1000


async def test_a_message_past_the_limit_closes_with_1009() -> None:
    async with _server() as address, connect(f"ws://{address}/echo", max_size=None) as ws:
        await ws.send(b"x" * (MAX_MESSAGE_BYTES + 1))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1009


async def test_a_plain_request_on_the_same_server_gets_http() -> None:
    async with _server() as address, httpx.AsyncClient() as client:
        answer = await client.get(f"http://{address}/echo")
        assert answer.status_code == 404
        upgrade = {"Connection": "Upgrade", "Upgrade": "h2c"}  # a switch the handler does not take: HTTP, then closed
        assert (await client.get(f"http://{address}/echo", headers=upgrade)).status_code == 404


def test_the_accept_key_is_the_rfcs_example() -> None:
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


async def test_a_peer_that_closes_its_side_ends_the_handler() -> None:
    """Half-closed by the client (FIN, no close frame): the handler's receive ends, and so does the connection."""
    async with _server() as address:
        host, port = address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 ")
        writer.write_eof()
        async with asyncio.timeout(10):
            rest = await reader.read()  # returns once the server has closed the connection
        assert rest == b""
        writer.close()
        await writer.wait_closed()
