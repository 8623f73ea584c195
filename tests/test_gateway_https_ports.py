"""E2B's `httpsPorts` on the data plane: a port whose server speaks TLS itself is reached over TLS (its
certificate unverified, so a self-signed one works), for HTTP and WebSockets; other ports stay plain."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import InvalidStatus

from activator import Ingress
from tests.test_gateway_http_proxy import client, run, running_gateway, serving_config
from tests.test_gateway_traffic_token import SANDBOX, echo_headers, routing
from tests.tls_fixtures import self_signed


def _tls_config(tmp_path: Path) -> uvicorn.Config:
    made = self_signed(tmp_path)
    return uvicorn.Config(
        echo_headers, log_config=None, lifespan="off", proxy_headers=False, timeout_graceful_shutdown=1,
        ssl_certfile=str(made.certificate), ssl_keyfile=str(made.key),
    )  # fmt: skip


def _bound() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def test_an_https_port_is_reached_over_tls_with_the_masked_host(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving_config(_tls_config(tmp_path), _bound()) as upstream, running_gateway(upstream) as gw:
            gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(8000,), mask_request_host="localhost:${PORT}")
            async with client() as http:
                for _ in range(2):  # the second one over the kept TLS connection
                    response = await http.get(gw.url + "/", headers=routing(8000))
                    assert response.status_code == 200
                    assert response.json()["host"] == "localhost:8000"
            assert len(gw.opener.opened) == 1

    run(scenario())


def test_a_tls_port_not_listed_as_https_is_a_bad_gateway(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving_config(_tls_config(tmp_path), _bound()) as upstream, running_gateway(upstream) as gw:
            gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(9000,))
            async with client() as http:
                response = await http.get(gw.url + "/", headers=routing(8000))
            assert response.status_code == 502
            assert response.json()["sandboxId"] == SANDBOX

    run(scenario())


def test_the_sni_names_the_masked_host(tmp_path: Path) -> None:
    made = self_signed(tmp_path)
    names: list[str | None] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    context = made.server_context()
    context.sni_callback = lambda _sock, name, _context: names.append(name)

    async def scenario() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=context)
        async with server, running_gateway(server.sockets[0].getsockname()[1]) as gw, client() as http:
            for mask, name in (("app.internal:${PORT}", "app.internal"), ("[::1]:${PORT}", None)):
                gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(8000,), mask_request_host=mask)
                gw.dataplane.pool.drop(SANDBOX)
                assert (await http.get(gw.url + "/", headers=routing(8000))).text == "ok"
                assert names.pop() == (name or "localhost")  # an address is no name: `localhost` then

    run(scenario())


def test_a_response_that_ends_with_the_tls_connection_is_whole(tmp_path: Path) -> None:
    """HTTP/1.0 without a length, closed with no TLS close_notify (Python's http.server over ssl does so)."""
    made = self_signed(tmp_path)
    body = b"x" * 100_000

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body)
        await writer.drain()
        writer.transport.abort()  # the TCP connection ends, the TLS session is never closed

    async def scenario() -> None:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=made.server_context())
        async with server, running_gateway(server.sockets[0].getsockname()[1]) as gw, client() as http:
            gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(8000,))
            response = await http.get(gw.url + "/", headers=routing(8000))
            assert response.status_code == 200
            assert response.content == body

    run(scenario())


def test_a_plain_port_listed_as_https_is_a_bad_gateway() -> None:
    async def scenario() -> None:
        async with serving_config(_plain_config(), _bound()) as upstream, running_gateway(upstream) as gw:
            gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(8000,))
            async with client() as http:
                response = await http.get(gw.url + "/", headers=routing(8000))
            assert response.status_code == 502
            assert response.json()["code"] == 502

    run(scenario())


def _plain_config() -> uvicorn.Config:
    return uvicorn.Config(echo_headers, log_config=None, lifespan="off", proxy_headers=False)


def test_websockets_reach_an_https_port_over_tls(tmp_path: Path) -> None:
    made = self_signed(tmp_path)

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        await ws.send(json.dumps({"host": ws.request.headers["Host"]}))

    async def scenario() -> None:
        async with serve(handler, "127.0.0.1", 0, ssl=made.server_context()) as server:
            upstream = next(iter(server.sockets)).getsockname()[1]
            async with running_gateway(upstream) as gw:
                gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(8000,))
                async with connect(gw.url.replace("http", "ws") + "/", additional_headers=routing(8000)) as ws:
                    assert json.loads(await ws.recv())["host"] == gw.url.removeprefix("http://")

    run(scenario())


def test_a_websocket_to_a_plain_port_listed_as_https_is_refused() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send("plain")

    async def scenario() -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            upstream = next(iter(server.sockets)).getsockname()[1]
            async with running_gateway(upstream) as gw:
                gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(8000,))
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(gw.url.replace("http", "ws") + "/", additional_headers=routing(8000)):
                        pass
                assert refused.value.response.status_code == 502

    run(scenario())
