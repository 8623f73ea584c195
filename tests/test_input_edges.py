"""Malformed input at every edge gets a 400 in that protocol's own shape, never a 500 (issue 14, item 9).

Control plane: E2B's `{"code": 400, "message"}`. envd: `{"code": 400, "message"}` on `/init`, Connect's
`{"code": "invalid_argument", "message"}` on its RPCs. Data plane: the gateway's `{"message", "code": 400}`.
The limits: JSON nested past the decoder's depth (about 1,000 levels), environment variable names that are empty or
hold `=` or NUL, values that hold NUL, sandbox ids that are not 1 to 64 of [a-z0-9], Hosts longer than a DNS name
and a port.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from executor.envd import END_STREAM, ENVELOPE_HEADER, STREAM_TYPE, UNARY_TYPE
from gateway._routing import MAX_HOST_LENGTH
from tests.executor_fixtures import Envd, run_executor
from tests.test_e2b_api_http import client, plane
from tests.test_gateway_http_proxy import client as gateway_client
from tests.test_gateway_http_proxy import echo, run, running_gateway, serving

__all__ = ["client", "plane"]  # the control plane and its client of the API tests, reused

DEEP = b"[" * 100_000 + b"]" * 100_000  # 200 kB: well under the 1 MiB body limit
DEEP_FIELD = b'{"templateID": "base", "extra": ' + b"[" * 1_000 + b"]" * 1_000 + b"}"  # in a field nobody reads
BAD_ENVS: list[dict[str, str]] = [{"A=B": "1"}, {"=A": "1"}, {"": "1"}, {"A\x00B": "1"}, {"A": "x\x00y"}]
BAD_IDS = ["a" * 65, "a" * 10_000, "ABC123", "abc-123", "abc%00", "%C3%A9t%C3%A9"]


def assert_e2b_error(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text[:300]
    body = response.json()
    assert set(body) == {"code", "message"}
    assert body["code"] == status
    assert "Traceback" not in body["message"]
    message: str = body["message"]
    return message


# Control plane


@pytest.mark.parametrize("body", [DEEP, DEEP_FIELD], ids=["deep array", "deep unknown field"])
@pytest.mark.parametrize("path", ["/v2/sandboxes", "/sandboxes/abc123/timeout", "/v2/sandboxes/abc123/connect"])
def test_deeply_nested_json_is_a_400(client: httpx.Client, path: str, body: bytes) -> None:
    message = assert_e2b_error(client.post(path, content=body, headers={"Content-Type": "application/json"}))
    assert "nested too deeply" in message


def test_a_body_over_a_mebibyte_is_a_413(client: httpx.Client) -> None:
    assert_e2b_error(client.post("/v2/sandboxes", content=b"[" * (1 << 20) + b"]" * (1 << 20)), 413)


@pytest.mark.parametrize("envs", BAD_ENVS)
def test_create_refuses_env_vars_that_execve_cannot_pass(client: httpx.Client, envs: dict[str, str]) -> None:
    message = assert_e2b_error(client.post("/v2/sandboxes", json={"templateID": "base", "envVars": envs}))
    assert "envVars" in message


def test_create_takes_env_values_with_equals_signs_and_empty_ones(client: httpx.Client) -> None:
    envs = {"URL": "a=b&c=d", "EMPTY": "", "UNICODE_É": "é"}
    response = client.post("/v2/sandboxes", json={"templateID": "base", "envVars": envs})
    assert response.status_code == 201


@pytest.mark.parametrize("sandbox_id", BAD_IDS)
@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", "/sandboxes/{}", {}),
        ("DELETE", "/sandboxes/{}", {}),
        ("POST", "/sandboxes/{}/timeout", {"json": {"timeout": 5}}),
        ("POST", "/v2/sandboxes/{}/connect", {"json": {}}),
        ("GET", "/v2/sandboxes/{}/logs", {}),
        ("GET", "/sandboxes/{}/metrics", {}),
    ],
)
def test_a_sandbox_id_outside_its_shape_is_a_400(
    client: httpx.Client, method: str, path: str, kwargs: dict[str, Any], sandbox_id: str
) -> None:
    message = assert_e2b_error(client.request(method, path.format(sandbox_id), **kwargs))
    assert "sandbox_id" in message


def test_a_sandbox_id_of_64_characters_is_looked_up(client: httpx.Client) -> None:
    assert_e2b_error(client.get(f"/sandboxes/{'a' * 64}"), 404)


# envd (an executor of its own: /init changes its defaults)


@pytest.fixture(scope="module")
def envd() -> Iterator[Envd]:
    """The fixture fails the module if the executor logged a traceback (an unexpected error)."""
    with run_executor() as running:
        yield running


def start(client: httpx.Client, payload: bytes) -> dict[str, Any]:
    """The end-of-stream trailer of a Process/Start call (Connect streams answer errors there, with 200)."""
    request = ENVELOPE_HEADER.pack(0, len(payload)) + payload
    response = client.post("/process.Process/Start", content=request, headers={"Content-Type": STREAM_TYPE})
    assert response.status_code == 200
    content, at = response.content, 0
    while True:
        flags, size = ENVELOPE_HEADER.unpack_from(content, at)
        at += ENVELOPE_HEADER.size + size
        if flags & END_STREAM:
            trailer: dict[str, Any] = json.loads(content[at - size : at])
            return trailer


@pytest.mark.parametrize("envs", BAD_ENVS)
def test_init_refuses_bad_env_vars_and_keeps_the_old_ones(envd: Envd, envs: dict[str, str]) -> None:
    with envd.client() as client:
        assert client.post("/init", json={"envVars": {"KEPT": "1"}}).status_code == 204
        assert_e2b_error(client.post("/init", json={"envVars": envs}))
        assert client.get("/envs").json() == {"KEPT": "1"}
        assert start(client, json.dumps({"process": {"cmd": "/bin/true"}}).encode()).get("error") is None


@pytest.mark.parametrize("envs", BAD_ENVS)
def test_process_start_refuses_bad_env_vars_as_invalid_argument(envd: Envd, envs: dict[str, str]) -> None:
    with envd.client() as client:
        trailer = start(client, json.dumps({"process": {"cmd": "/bin/true", "envs": envs}}).encode())
    assert trailer["error"]["code"] == "invalid_argument"
    assert "envs" in trailer["error"]["message"]


@pytest.mark.parametrize("body", [DEEP, b'{"x": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"], ids=["array", "field"])
def test_deeply_nested_envd_messages_are_invalid_arguments(envd: Envd, body: bytes) -> None:
    """A nested array is refused by its type at once; nesting in a field nobody reads reaches the depth limit."""
    with envd.client() as client:
        assert assert_e2b_error(client.post("/init", content=body)).startswith("invalid init message: ")
        unary = client.post("/process.Process/List", content=body, headers={"Content-Type": UNARY_TYPE})
        assert unary.status_code == 400
        assert unary.json()["code"] == "invalid_argument"
        assert start(client, body)["error"]["code"] == "invalid_argument"


# Data plane


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "x" * (MAX_HOST_LENGTH + 1)},
        {"Host": "8000-abc123." + "x" * 60_000 + ".sandbox.localhost"},
        {"Host": f"8000-{'a' * 65}.sandbox.localhost"},
        {"Host": "8000-abc\u00e9.sandbox.localhost"},
        {"Host": "0-abc123.sandbox.localhost"},
        {"E2b-Sandbox-Id": "a" * 10_000, "E2b-Sandbox-Port": "8000"},
        {"E2b-Sandbox-Id": "abc_123", "E2b-Sandbox-Port": "8000"},
    ],
    ids=["long host", "60k host", "long id in host", "non-ascii host", "port 0", "10k id header", "underscore"],
)
def test_odd_hosts_and_ids_get_the_gateways_400(headers: dict[str, str]) -> None:
    raw = {name.encode(): value.encode() for name, value in headers.items()}  # UTF-8 on the wire, as sent

    async def scenario() -> None:
        async with serving(echo) as upstream, running_gateway(upstream) as gw, gateway_client() as http:
            response = await http.get(gw.url + "/", headers=raw)
        assert response.status_code == 400
        body = response.json()
        assert set(body) == {"message", "code"}
        assert body["code"] == 400
        assert len(body["message"]) < 300  # the offending value is not sent back whole
        assert gw.opener.opened == []

    run(scenario())
