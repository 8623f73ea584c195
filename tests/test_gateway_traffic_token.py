"""Private ports and Host masking on the data plane: uvicorn + DataPlane in front of real HTTP and WebSocket servers.

The sandbox's ingress rules come from the opener (`LoopbackOpener.ingresses`), as the activator's route cache
hands them out; the E2B SDK end of the same behaviour is in tests/test_e2b_network_options.py.
"""

from __future__ import annotations

import json

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import InvalidStatus

from activator import Ingress
from executor.envd import ENVD_PORT
from gateway._errors_response import Receive, Scope, Send
from tests.test_gateway_http_proxy import client, run, running_gateway, serving
from tests.test_gateway_ws_proxy import ws_upstream

TOKEN = "s3cret-token"
SANDBOX = "abc123"
MISSING = "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
INVALID = "Sandbox is secured with traffic access token. Provided token is invalid."


async def echo_headers(scope: Scope, receive: Receive, send: Send) -> None:
    """An upstream that answers with the request headers it got, as a JSON object."""
    body = json.dumps({name.decode(): value.decode() for name, value in scope["headers"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def routing(port: int) -> dict[str, str]:
    return {"E2b-Sandbox-Id": SANDBOX, "E2b-Sandbox-Port": str(port)}


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 403, MISSING),
        ({"e2b-traffic-access-token": "wrong"}, 403, INVALID),
        ({"e2b-traffic-access-token": ""}, 403, INVALID),
        ({"e2b-traffic-access-token": TOKEN}, 200, None),
        ({"E2B-Traffic-Access-Token": TOKEN}, 200, None),  # as e2b-code-interpreter sends it
    ],
)
def test_private_ports_answer_only_with_the_traffic_token(
    headers: dict[str, str], status: int, message: str | None
) -> None:
    async def scenario() -> None:
        async with serving(echo_headers) as upstream, running_gateway(upstream) as gw, client() as http:
            gw.opener.ingresses[SANDBOX] = Ingress(traffic_access_token=TOKEN)
            response = await http.get(gw.url + "/", headers={**routing(8000), **headers})
            assert response.status_code == status
            if message is None:
                assert "e2b-traffic-access-token" not in response.json()  # never forwarded to the sandbox
                assert gw.opener.touched == [SANDBOX]
            else:
                assert response.json() == {"sandboxId": SANDBOX, "message": message, "code": 403}
                assert gw.opener.opened == []  # refused before any wake-up
                assert gw.opener.touched == []

    run(scenario())


def test_envd_port_needs_no_traffic_token_and_keeps_its_host() -> None:
    async def scenario() -> None:
        async with serving(echo_headers) as upstream, running_gateway(upstream) as gw, client() as http:
            gw.opener.ingresses[SANDBOX] = Ingress(traffic_access_token=TOKEN, mask_request_host="masked:${PORT}")
            response = await http.get(gw.url + "/", headers=routing(ENVD_PORT))
            assert response.status_code == 200
            assert response.json()["host"] == gw.url.removeprefix("http://")

    run(scenario())


def test_public_ports_pass_and_the_token_header_is_still_not_forwarded() -> None:
    async def scenario() -> None:
        async with serving(echo_headers) as upstream, running_gateway(upstream) as gw, client() as http:
            response = await http.get(gw.url + "/", headers={**routing(8000), "e2b-traffic-access-token": "x"})
            assert response.status_code == 200
            assert "e2b-traffic-access-token" not in response.json()

    run(scenario())


def test_the_host_mask_replaces_the_host_with_the_port_filled_in() -> None:
    async def scenario() -> None:
        async with serving(echo_headers) as upstream, running_gateway(upstream) as gw, client() as http:
            gw.opener.ingresses[SANDBOX] = Ingress(mask_request_host="localhost:${PORT}")
            seen = (await http.get(gw.url + "/", headers=routing(8000))).json()
            assert seen["host"] == "localhost:8000"
            assert seen["x-forwarded-host"] == gw.url.removeprefix("http://")

    run(scenario())


def test_websockets_need_the_token_and_get_the_masked_host() -> None:
    hosts: list[str] = []

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        hosts.append(ws.request.headers["Host"])
        await ws.send("hi")

    async def scenario() -> None:
        async with ws_upstream(handler) as upstream, running_gateway(upstream) as gw:
            gw.opener.ingresses[SANDBOX] = Ingress(traffic_access_token=TOKEN, mask_request_host="${PORT}.app.test")
            url = gw.url.replace("http", "ws") + "/"
            with pytest.raises(InvalidStatus) as refused:
                async with connect(url, additional_headers=routing(8000)):
                    pass
            assert refused.value.response.status_code == 403
            assert json.loads(refused.value.response.body or b"")["message"] == MISSING
            async with connect(url, additional_headers={**routing(8000), "e2b-traffic-access-token": TOKEN}) as ws:
                assert await ws.recv() == "hi"
        assert hosts == ["8000.app.test"]

    run(scenario())


def test_host_routed_requests_are_checked_too() -> None:
    async def scenario() -> None:
        async with serving(echo_headers) as upstream, running_gateway(upstream) as gw, client() as http:
            gw.opener.ingresses[SANDBOX] = Ingress(traffic_access_token=TOKEN)
            response = await http.get(gw.url + "/x", headers={"Host": f"8000-{SANDBOX}.sandbox.localhost"})
            assert response.status_code == 403
            assert response.headers["content-type"] == "application/json"

    run(scenario())
