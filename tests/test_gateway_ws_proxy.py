"""The data plane's WebSocket proxy: a real websockets client → uvicorn + DataPlane → a real websockets server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from activator._errors import SandboxNotFound
from tests.test_gateway_http_proxy import Gateway, run, running_gateway

ROUTING = {"E2b-Sandbox-Id": "abc123", "E2b-Sandbox-Port": "8008"}


@asynccontextmanager
async def ws_upstream(
    handler: object, *, refuse: Response | None = None, subprotocols: list[str] | None = None
) -> AsyncIterator[int]:
    """A websockets server on a free loopback port, refusing every handshake with ``refuse`` if given."""

    def process_request(connection: ServerConnection, request: Request) -> Response | None:
        return refuse

    async with serve(
        handler,  # type: ignore[arg-type]
        "127.0.0.1",
        0,
        process_request=process_request,
        subprotocols=[Subprotocol(name) for name in subprotocols] if subprotocols else None,
    ) as server:
        yield next(iter(server.sockets)).getsockname()[1]


def client_of(gw: Gateway, path: str = "/", **kwargs: object) -> connect:
    return connect(gw.url.replace("http", "ws") + path, additional_headers=ROUTING, **kwargs)  # type: ignore[arg-type]


async def echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


def test_echo_relays_text_and_binary_both_ways_with_the_chosen_subprotocol() -> None:
    seen: dict[str, str] = {}

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        seen.update(path=ws.request.path, custom=ws.request.headers["X-Custom"], host=ws.request.headers["Host"])
        await echo(ws)

    async def scenario() -> None:
        async with ws_upstream(handler, subprotocols=["v2"]) as upstream, running_gateway(upstream) as gw:
            offered = [Subprotocol("v1"), Subprotocol("v2")]
            async with connect(
                gw.url.replace("http", "ws") + "/path?q=1",
                additional_headers={**ROUTING, "X-Custom": "yes"},
                subprotocols=offered,
            ) as ws:
                assert ws.subprotocol == "v2"
                await ws.send("hello")
                assert await ws.recv() == "hello"
                await ws.send(b"\x00\x01\xff")
                assert await ws.recv() == b"\x00\x01\xff"
            assert gw.opener.touched.count("abc123") >= 5  # the upgrade, then every frame
        assert seen == {"path": "/path?q=1", "custom": "yes", "host": gw.url.removeprefix("http://")}

    run(scenario())


def test_host_routed_websocket_reaches_the_sandbox_port() -> None:
    async def scenario() -> None:
        async with ws_upstream(echo) as upstream, running_gateway(upstream) as gw:
            port = int(gw.url.rpartition(":")[2])
            async with connect("ws://8008-abc123.sandbox.localhost/", host="127.0.0.1", port=port) as ws:
                await ws.send("ping")
                assert await ws.recv() == "ping"
        assert gw.opener.opened == [("abc123", 8008)]

    run(scenario())


def test_upstream_refusal_reaches_the_client_with_its_status_and_body() -> None:
    body = b"no such socket\n"
    headers = Headers([("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    refusal = Response(HTTPStatus.NOT_FOUND.value, "Not Found", headers, body)

    async def scenario() -> None:
        async with ws_upstream(echo, refuse=refusal) as upstream, running_gateway(upstream) as gw:
            with pytest.raises(InvalidStatus) as refused:
                await client_of(gw)
        assert (refused.value.response.status_code, refused.value.response.body) == (404, body)

    run(scenario())


def test_unknown_sandbox_refuses_the_websocket_with_502_was_not_found() -> None:
    async def scenario() -> None:
        async with running_gateway(upstream_port=9, error=SandboxNotFound("no such sandbox")) as gw:
            with pytest.raises(InvalidStatus) as refused:
                await client_of(gw)
        response = refused.value.response
        assert response.status_code == 502
        assert json.loads(response.body or b"") == {
            "sandboxId": "abc123",
            "message": "The sandbox was not found",
            "code": 502,
        }

    run(scenario())


def test_upstream_close_code_and_reason_reach_the_client() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.close(4001, "bye")

    async def scenario() -> None:
        async with ws_upstream(handler) as upstream, running_gateway(upstream) as gw, client_of(gw) as ws:
            await _closed(ws)
            assert (ws.close_code, ws.close_reason) == (4001, "bye")

    run(scenario())


def test_client_close_code_and_reason_reach_the_upstream() -> None:
    async def scenario() -> None:
        closed: asyncio.Future[tuple[int | None, str | None]] = asyncio.get_running_loop().create_future()

        async def handler(ws: ServerConnection) -> None:
            await ws.wait_closed()
            closed.set_result((ws.close_code, ws.close_reason))

        async with ws_upstream(handler) as upstream, running_gateway(upstream) as gw:
            async with client_of(gw) as ws:
                await ws.close(4002, "done")
            assert await closed == (4002, "done")

    run(scenario())


def test_upstream_dropping_the_connection_drops_the_client() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.recv()
        ws.transport.abort()

    async def scenario() -> None:
        async with ws_upstream(handler) as upstream, running_gateway(upstream) as gw, client_of(gw) as ws:
            await ws.send("go")
            await _closed(ws)
            assert ws.close_code == 1006  # no close frame, as from the sandbox

    run(scenario())


async def _closed(ws: ClientConnection) -> None:
    with pytest.raises(ConnectionClosed):
        await ws.recv()
