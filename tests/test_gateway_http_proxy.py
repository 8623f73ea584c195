"""The data plane's HTTP proxy, driven through real uvicorn servers on loopback: client → gateway → upstream.

The harness here (``LoopbackOpener``, ``serving``, ``running_gateway``, ``run``) is reused by the WebSocket tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn
import uvloop

from activator import Ingress
from activator._errors import HoldQueueFull, HoldTimeout, PortNotOpen, SandboxNotFound
from gateway._dataplane import DataPlane
from gateway._errors_response import ASGIApp, Message, Receive, Scope, Send

ROUTED = {"Host": "8008-abc123.sandbox.localhost"}
StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class LoopbackOpener:
    """The lifecycle layer reduced to "connect to this loopback port", or to raising ``error``."""

    def __init__(self, port: int, error: Exception | None = None) -> None:
        self.port, self.error = port, error
        self.opened: list[tuple[str, int]] = []
        self.touched: list[str] = []
        self.ingresses: dict[str, Ingress] = {}  # what `ingress` answers per sandbox (None when absent)

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket:
        self.opened.append((sandbox_id, port))
        if self.error is not None:
            raise self.error
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        except OSError:
            sock.close()
            raise
        return sock

    def touch(self, sandbox_id: str) -> None:
        self.touched.append(sandbox_id)

    async def ingress(self, sandbox_id: str) -> Ingress | None:
        return self.ingresses.get(sandbox_id)


def run(scenario: Coroutine[Any, Any, None]) -> None:
    """Runs a test scenario on a fresh uvloop loop (what uvicorn picks), failing it rather than hanging past 20 s."""

    async def bounded() -> None:
        async with asyncio.timeout(20):
            await scenario

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(bounded())


@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[int]:
    """Serves ``app`` with a real uvicorn on a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_config=None, lifespan="off", proxy_headers=False, timeout_graceful_shutdown=1)
    async with serving_config(config, sock) as port:
        yield port


@asynccontextmanager
async def serving_config(config: uvicorn.Config, sock: socket.socket) -> AsyncIterator[int]:
    """Serves `config` with a real uvicorn on `sock`, a bound socket."""
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # uvicorn offers a flag, not an event
        if task.done():
            task.result()  # raises why the server did not start
        await asyncio.sleep(0.005)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


def replying(reply: bytes) -> StreamHandler:
    """A raw upstream handler that reads one request head, writes `reply` as it is, and hangs up."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        writer.close()

    return handler


@asynccontextmanager
async def raw_serving(handler: StreamHandler) -> AsyncIterator[int]:
    """Serves a raw stream handler (an upstream that does not speak proper HTTP)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def control_plane(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"control plane"})


class Gateway:
    def __init__(self, url: str, opener: LoopbackOpener, dataplane: DataPlane) -> None:
        self.url, self.opener, self.dataplane = url, opener, dataplane


@asynccontextmanager
async def running_gateway(upstream_port: int, error: Exception | None = None) -> AsyncIterator[Gateway]:
    """A gateway (DataPlane over ``control_plane``) whose sandbox ports all lead to ``upstream_port``."""
    opener = LoopbackOpener(upstream_port, error)
    dataplane = DataPlane(control_plane, opener=opener, domain="sandbox.localhost")
    async with serving(dataplane) as port:
        yield Gateway(f"http://127.0.0.1:{port}", opener, dataplane)
        dataplane.pool.close()


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False)


async def read_body(receive: Receive) -> list[bytes]:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers with what it received, as JSON."""
    body = b"".join(await read_body(receive))
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    headers = [[name.decode(), value.decode()] for name, value in scope["headers"]]
    payload = {"method": scope["method"], "target": target.decode(), "headers": headers, "body": body.decode()}
    data = json.dumps({**payload, "clientPort": scope["client"][1]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


# Routing


def test_host_routed_request_reaches_the_port_with_hop_headers_replaced_by_forwarded_ones() -> None:
    async def scenario() -> None:
        hop = {
            "Connection": "keep-alive, x-hop",
            "X-Hop": "1",
            "Keep-Alive": "timeout=5",
            "X-Forwarded-For": "10.0.0.1",
        }
        async with serving(echo) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.post(gw.url + "/a/b?c=d", headers={**ROUTED, **hop}, content=b"payload")
        echoed = response.json()
        headers = dict(echoed["headers"])
        assert response.status_code == 200
        assert (echoed["method"], echoed["target"], echoed["body"]) == ("POST", "/a/b?c=d", "payload")
        assert headers["host"] == headers["x-forwarded-host"] == "8008-abc123.sandbox.localhost"
        assert (headers["x-forwarded-for"], headers["x-forwarded-proto"]) == ("10.0.0.1, 127.0.0.1", "http")
        assert {"x-hop", "keep-alive"}.isdisjoint(headers)
        assert gw.opener.opened == [("abc123", 8008)]
        assert gw.opener.touched == ["abc123"]

    run(scenario())


def test_header_routed_request_reaches_the_port_named_by_the_headers() -> None:
    async def scenario() -> None:
        routing = {"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "49983"}
        async with serving(echo) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.get(gw.url + "/health", headers=routing)
        assert response.status_code == 200
        assert response.json()["target"] == "/health"
        assert gw.opener.opened == [("abc123", 49983)]

    run(scenario())


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:3000", "sandbox.localhost", "example.com"])
def test_unrouted_requests_reach_the_control_plane(host: str) -> None:
    async def scenario() -> None:
        async with serving(echo) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.get(gw.url + "/health", headers={"Host": host})
        assert (response.status_code, response.text) == (200, "control plane")
        assert gw.opener.opened == []

    run(scenario())


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "x.8008-abc123.sandbox.localhost"},
        {"Host": "port-abc123.sandbox.localhost"},
        {"E2b-Sandbox-Id": "abc123"},
        {"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "99999"},
    ],
)
def test_malformed_sandbox_address_answers_400_json(headers: dict[str, str]) -> None:
    async def scenario() -> None:
        async with serving(echo) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.get(gw.url + "/", headers=headers)
        assert response.status_code == 400
        assert response.json()["code"] == 400
        assert gw.opener.opened == []

    run(scenario())


# Streaming


def test_chunked_request_body_reaches_the_upstream_incrementally() -> None:
    first_arrived = asyncio.Event()

    async def upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[Message] = []
        while not chunks or chunks[-1]["more_body"]:
            chunks.append(await receive())
            if chunks[-1]["body"] == b"first":
                first_arrived.set()
        framing = dict(scope["headers"]).get(b"transfer-encoding", b"")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": framing + b" " + b"".join(c["body"] for c in chunks)})

    async def body() -> AsyncIterator[bytes]:
        yield b"first"
        await first_arrived.wait()  # a proxy that waits for the whole body never lets this return
        yield b"second"

    async def scenario() -> None:
        async with serving(upstream_app) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.post(gw.url + "/", headers=ROUTED, content=body())
        assert response.text == "chunked firstsecond"

    run(scenario())


def test_streamed_response_reaches_the_client_chunk_by_chunk() -> None:
    first_received = asyncio.Event()

    async def upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await first_received.wait()  # a proxy that waits for the whole body never lets this return
        await send({"type": "http.response.body", "body": b"two"})

    async def scenario() -> None:
        async with (
            serving(upstream_app) as upstream,
            running_gateway(upstream) as gw,
            client() as http,
            http.stream("GET", gw.url + "/", headers=ROUTED) as response,
        ):
            chunks = response.aiter_raw()
            assert await anext(chunks) == b"one"
            first_received.set()
            assert b"".join([chunk async for chunk in chunks]) == b"two"

    run(scenario())


def test_twenty_mib_bodies_stream_both_ways_without_being_buffered_whole() -> None:
    size, block = 20 * 1024 * 1024, b"x" * 65536

    async def upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
        received, more_body = 0, True
        while more_body:
            message = await receive()
            received, more_body = received + len(message["body"]), message["more_body"]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-received", b"%d" % received)]})
        for _ in range(size // len(block)):
            await send({"type": "http.response.body", "body": block, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(size // len(block)):
            yield block

    async def scenario() -> None:
        async with serving(upstream_app) as upstream, running_gateway(upstream) as gw, client() as http:
            tracemalloc.start()
            try:
                async with http.stream("POST", gw.url + "/", headers=ROUTED, content=upload()) as response:
                    downloaded = sum([len(chunk) async for chunk in response.aiter_raw()])
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert (int(response.headers["x-received"]), downloaded) == (size, size)
        # Everything (client, gateway, upstream) runs in this process; a proxy that held either body whole
        # would alone account for 20 MiB. (Under load the three sides' buffers fill unevenly: a few MiB.)
        assert peak < 16 * 1024 * 1024

    run(scenario())


@pytest.mark.parametrize(
    ("reply", "status", "body"),
    [
        pytest.param(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", 200, b"until the end", id="body-ends-at-eof"),
        pytest.param(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", 304, b"", id="304-with-a-length"),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
            201,
            b"ok",
            id="interim-100-then-final",
        ),
    ],
)
def test_unusually_framed_responses_reach_the_client_whole(reply: bytes, status: int, body: bytes) -> None:
    async def scenario() -> None:
        async with raw_serving(replying(reply)) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.get(gw.url + "/", headers=ROUTED)
        assert (response.status_code, response.content) == (status, body)

    run(scenario())


# Connection reuse


def test_sequential_requests_reuse_one_upstream_connection() -> None:
    async def scenario() -> None:
        async with serving(echo) as upstream, running_gateway(upstream) as gw, client() as http:
            ports = {(await http.get(gw.url + f"/{i}", headers=ROUTED)).json()["clientPort"] for i in range(3)}
        assert len(ports) == 1
        assert len(gw.opener.opened) == 1

    run(scenario())


def test_dropping_a_sandbox_closes_its_idle_upstream_connections() -> None:
    async def scenario() -> None:
        async with serving(echo) as upstream, running_gateway(upstream) as gw, client() as http:
            before = (await http.get(gw.url + "/", headers=ROUTED)).json()["clientPort"]
            gw.dataplane.pool.drop("abc123")
            after = (await http.get(gw.url + "/", headers=ROUTED)).json()["clientPort"]
        assert before != after
        assert len(gw.opener.opened) == 2

    run(scenario())


def test_head_request_answers_headers_only_and_the_next_request_still_works() -> None:
    async def upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})

    async def scenario() -> None:
        async with serving(upstream_app) as upstream, running_gateway(upstream) as gw, client() as http:
            head = await http.head(gw.url + "/", headers=ROUTED)
            get = await http.get(gw.url + "/", headers=ROUTED)
        assert (head.status_code, head.headers["content-length"], head.content) == (200, "5", b"")
        assert get.content == b"hello"

    run(scenario())


# Errors


@pytest.mark.parametrize(
    ("error", "status", "body"),
    [
        pytest.param(
            SandboxNotFound("no such sandbox"),
            502,
            {"sandboxId": "abc123", "message": "The sandbox was not found", "code": 502},
            id="unknown-sandbox-answers-502-was-not-found",
        ),
        pytest.param(
            PortNotOpen("nothing listens"),
            502,
            {"sandboxId": "abc123", "message": "The sandbox is running but port is not open", "code": 502},
            id="closed-port-answers-502-port-is-not-open",
        ),
        pytest.param(
            HoldQueueFull("Too many requests are waiting"),
            503,
            {"code": 503, "message": "Too many requests are waiting"},
            id="full-hold-queue-answers-503",
        ),
        pytest.param(
            HoldTimeout("The sandbox did not resume in time"),
            504,
            {"code": 504, "message": "The sandbox did not resume in time"},
            id="hold-timeout-answers-504",
        ),
    ],
)
def test_lifecycle_errors_answer_in_e2b_error_shape(error: Exception, status: int, body: dict[str, Any]) -> None:
    async def scenario() -> None:
        async with running_gateway(upstream_port=9, error=error) as gw, client() as http:
            response = await http.get(gw.url + "/", headers=ROUTED)
        assert (response.status_code, response.json()) == (status, body)
        assert response.headers.get("retry-after") == ("1" if status == 503 else None)

    run(scenario())


def test_refused_connection_answers_502_port_is_not_open() -> None:
    async def scenario() -> None:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))  # bound but not listening: connecting is refused
            async with running_gateway(unused.getsockname()[1]) as gw, client() as http:
                response = await http.get(gw.url + "/", headers=ROUTED)
        assert response.status_code == 502
        assert response.json() == {
            "sandboxId": "abc123",
            "message": "The sandbox is running but port is not open",
            "code": 502,
        }

    run(scenario())


@pytest.mark.parametrize("reply", [b"SPAM SPAM SPAM\r\n\r\n", b""], ids=["garbage", "hang-up"])
def test_upstream_that_does_not_answer_http_answers_502_json(reply: bytes) -> None:
    async def scenario() -> None:
        async with raw_serving(replying(reply)) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.get(gw.url + "/", headers=ROUTED)
        assert response.status_code == 502
        assert response.json()["sandboxId"] == "abc123"

    run(scenario())


def test_client_disconnect_mid_stream_closes_the_upstream_quietly(caplog: pytest.LogCaptureFixture) -> None:
    upstream_saw_disconnect = asyncio.Event()

    async def upstream_app(scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        if (await receive())["type"] == "http.disconnect":
            upstream_saw_disconnect.set()

    async def scenario() -> None:
        async with serving(upstream_app) as upstream, running_gateway(upstream) as gw:
            async with client() as http, http.stream("GET", gw.url + "/", headers=ROUTED) as response:
                assert await anext(response.aiter_raw()) == b"one"
            await upstream_saw_disconnect.wait()

    caplog.set_level(logging.WARNING)
    run(scenario())
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
