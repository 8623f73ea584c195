"""ClientWatch: a request held for a waking sandbox is released when its client leaves, and never proxied.

Real uvicorn, real sockets: the gateway is ClientWatch over the DataPlane, and its opener holds every request
on a `HoldGate` whose wake-up the test controls.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import httpx

from activator import CLIENT_GONE, Telemetry
from activator._holds import HoldGate
from gateway._client_watch import ClientWatch
from gateway._dataplane import DataPlane
from gateway._errors_response import Message, Receive, Scope, Send
from tests.test_gateway_http_proxy import ROUTED, LoopbackOpener, control_plane, echo, run, serving


class HeldOpener(LoopbackOpener):
    """Holds every open until `wake` is set, then connects to the loopback port."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.telemetry = Telemetry()
        self.gate = HoldGate(max_held=100, deadline=10, telemetry=self.telemetry)
        self.wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket:
        await self.gate.hold(self.wake)
        return await super().open_upstream(sandbox_id, port)


async def until(condition: Callable[[], bool]) -> None:
    """Wait (up to 5 s) for what the server does on its own in reaction to a socket event."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


async def send_and_leave(port: int, request: bytes) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    await asyncio.sleep(0.05)  # held by now
    writer.close()
    await writer.wait_closed()


def test_a_client_that_leaves_while_held_is_released_and_never_proxied() -> None:
    async def scenario() -> None:
        async with serving(echo) as upstream:
            opener = HeldOpener(upstream)
            app = ClientWatch(DataPlane(control_plane, opener=opener, domain="sandbox.localhost"))
            async with serving(app) as port:
                get = b"GET / HTTP/1.1\r\nHost: 8008-abc123.sandbox.localhost\r\n\r\n"
                upgrade = (
                    b"GET / HTTP/1.1\r\nHost: 8008-abc123.sandbox.localhost\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\n\r\n"
                )
                await asyncio.gather(send_and_leave(port, get), send_and_leave(port, upgrade))
                await until(lambda: opener.telemetry.holds["client_gone"] == 2)
                async with httpx.AsyncClient(trust_env=False) as client:
                    staying = asyncio.create_task(client.get(f"http://127.0.0.1:{port}/", headers=ROUTED))
                    await until(lambda: opener.gate.held == 1)
                    opener.wake.set_result(None)
                    assert (await staying).status_code == 200
                assert opener.gate.held == 0
                assert opener.telemetry.holds == {"client_gone": 2, "resumed": 1}
                assert len(opener.opened) == 1  # only the request whose client stayed reached the sandbox

    run(scenario())


def test_only_the_requests_own_task_sees_its_client_leave() -> None:
    async def scenario() -> None:
        messages: list[Message] = [
            {"type": "http.request", "body": b"", "more_body": False},
            {"type": "http.disconnect"},
        ]

        async def receive() -> Message:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        seen: list[Callable[[], Awaitable[object]]] = []

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await receive()
            gone = CLIENT_GONE.get()
            assert gone is not None
            await asyncio.wait_for(gone(), 1)  # the request's own task: the disconnect is next, and seen
            assert (await receive())["type"] == "http.disconnect"  # and still handed to the app afterwards
            seen.append(gone)

        await asyncio.create_task(ClientWatch(app)({"type": "http"}, receive, _no_send))  # as uvicorn does
        later = asyncio.ensure_future(seen[0]())  # a task that inherited the request's context, outliving it
        await asyncio.sleep(0.01)
        assert not later.done()
        later.cancel()

    run(scenario())


async def _no_send(message: Message) -> None:
    raise AssertionError("nothing is sent")
