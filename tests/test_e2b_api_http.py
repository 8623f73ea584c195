"""Raw HTTP: exact shapes and statuses, and bad input answered with E2B's JSON error while the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from executor.envd import ENVD_VERSION
from tests.test_e2b_api_server import ControlPlane, serve_control_plane

UNKNOWN = "doesnotexist0000000a"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with serve_control_plane(tmp_path_factory.mktemp("plane")) as plane:
        yield plane


@pytest.fixture
def client(plane: ControlPlane) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=plane.url, headers={"X-API-Key": plane.key}) as client:
        yield client


def _huge_chunks() -> Iterator[bytes]:
    yield b'{"templateID": "base", "metadata": {"x": "'
    for _ in range(64):
        yield b"y" * 32_768
    yield b'"}}'


BAD_REQUESTS: list[tuple[str, str, str, dict[str, Any], int]] = [
    ("malformed JSON", "POST", "/v2/sandboxes", {"content": b'{"templateID": '}, 400),
    ("not an object", "POST", "/v2/sandboxes", {"json": ["base"]}, 400),
    ("wrong type", "POST", "/v2/sandboxes", {"json": {"templateID": 7}}, 400),
    ("missing template", "POST", "/sandboxes", {"json": {"timeout": 10}}, 400),
    ("negative timeout", "POST", "/v2/sandboxes", {"json": {"templateID": "base", "timeout": -1}}, 400),
    ("timeout over the cap", "POST", "/v2/sandboxes", {"json": {"templateID": "base", "timeout": 10**9}}, 400),
    ("metadata not strings", "POST", "/v2/sandboxes", {"json": {"templateID": "base", "metadata": {"a": 1}}}, 400),
    ("unknown template", "POST", "/v2/sandboxes", {"json": {"templateID": "nope"}}, 404),
    ("huge body", "POST", "/v2/sandboxes", {"content": b'{"templateID": "' + b"x" * (2 << 20) + b'"}'}, 413),
    ("huge chunked body", "POST", "/v2/sandboxes", {"content": _huge_chunks()}, 413),
    ("unknown id: get", "GET", f"/sandboxes/{UNKNOWN}", {}, 404),
    ("unknown id: kill", "DELETE", f"/sandboxes/{UNKNOWN}", {}, 404),
    ("unknown id: pause", "POST", f"/sandboxes/{UNKNOWN}/pause", {"json": {}}, 404),
    ("unknown id: timeout", "POST", f"/sandboxes/{UNKNOWN}/timeout", {"json": {"timeout": 5}}, 404),
    ("unknown id: connect", "POST", f"/v2/sandboxes/{UNKNOWN}/connect", {"json": {}}, 404),
    ("unknown id: metrics", "GET", f"/sandboxes/{UNKNOWN}/metrics", {}, 404),
    ("unknown id: logs", "GET", f"/v2/sandboxes/{UNKNOWN}/logs", {}, 404),
    ("timeout body missing", "POST", f"/sandboxes/{UNKNOWN}/timeout", {"json": {}}, 400),
    ("unknown state", "GET", "/v2/sandboxes", {"params": {"state": "running,asleep"}}, 400),
    ("metadata pair without =", "GET", "/v2/sandboxes", {"params": {"metadata": "owner"}}, 400),
    ("limit too small", "GET", "/v2/sandboxes", {"params": {"limit": 0}}, 400),
    ("limit too large", "GET", "/v2/sandboxes", {"params": {"limit": 101}}, 400),
    ("limit not a number", "GET", "/v2/sandboxes", {"params": {"limit": "ten"}}, 400),
    ("foreign next token", "GET", "/v2/sandboxes", {"params": {"nextToken": "page2"}}, 400),
    ("unknown order", "GET", "/v2/sandboxes", {"params": {"order": "sideways"}}, 400),
    ("no API key", "GET", "/v2/sandboxes", {"headers": {"X-API-Key": ""}}, 401),
    ("malformed API key", "GET", "/v2/sandboxes", {"headers": {"X-API-Key": "e2b_bad"}}, 401),
    ("unknown API key", "GET", "/v2/sandboxes", {"headers": {"x-api-key": "e2b_" + "f" * 32}}, 401),
]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_REQUESTS],
)
def test_bad_request_gets_an_e2b_error(
    client: httpx.Client, method: str, path: str, kwargs: dict[str, Any], status: int
) -> None:
    response = client.request(method, path, **kwargs)
    assert response.status_code == status
    body = response.json()
    assert body["code"] == status
    assert isinstance(body["message"], str)
    assert "Traceback" not in body["message"]


def test_server_keeps_serving_after_bad_input(client: httpx.Client) -> None:
    for _, method, path, kwargs, _status in BAD_REQUESTS[:10]:
        client.request(method, path, **kwargs)
    assert client.get("/health").json()["status"] == "ok"
    assert client.post("/v2/sandboxes", json={"templateID": "base"}).status_code == 201


def test_health_needs_no_key_and_counts_sandboxes_by_state(plane: ControlPlane) -> None:
    response = httpx.get(f"{plane.url}/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert set(body["sandboxes"]) == {"running", "paused", "snapshotted"}
    assert body["held_requests"] == 0


def test_create_answers_the_exact_sandbox_shape(client: httpx.Client) -> None:
    response = client.post("/v2/sandboxes", json={"templateID": "base", "unknownField": {"x": 1}})
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {
        "templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken", "alias", "domain",
        "trafficAccessToken",
    }  # fmt: skip
    assert (body["domain"], body["trafficAccessToken"], body["envdVersion"]) == (None, None, ENVD_VERSION)
    assert body["sandboxID"].isalnum()
    assert body["sandboxID"].islower()
    assert len(body["sandboxID"]) == 20


def test_v1_create_without_secure_has_no_envd_token(client: httpx.Client) -> None:
    body = client.post("/sandboxes", json={"templateID": "base"}).json()
    assert "envdAccessToken" not in body
    assert client.post("/sandboxes", json={"templateID": "base", "secure": True}).json()["envdAccessToken"]


def test_connect_answers_200_running_and_201_resumed(client: httpx.Client) -> None:
    sandbox_id = client.post("/sandboxes", json={"templateID": "base", "timeout": 60}).json()["sandboxID"]
    assert client.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 30}).status_code == 200
    assert client.post(f"/sandboxes/{sandbox_id}/resume", json={}).status_code == 409
    assert client.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    assert client.post(f"/sandboxes/{sandbox_id}/resume", json={"timeout": 30}).status_code == 201
    assert client.post(f"/sandboxes/{sandbox_id}/pause").status_code == 204
    assert client.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 30}).status_code == 201


def test_refresh_and_listing_v1(client: httpx.Client) -> None:
    sandbox_id = client.post("/sandboxes", json={"templateID": "base", "metadata": {"v1": "yes"}}).json()["sandboxID"]
    assert client.post(f"/sandboxes/{sandbox_id}/refreshes", json={"duration": 600}).status_code == 204
    listed = client.get("/sandboxes", params={"metadata": "v1=yes"}).json()
    assert [s["sandboxID"] for s in listed] == [sandbox_id]
    assert listed[0]["endAt"] > listed[0]["startedAt"]


def test_templates_are_listed_in_e2b_shape(client: httpx.Client) -> None:
    for path in ("/templates", "/v2/templates"):
        [base] = client.get(path).json()
        assert (base["templateID"], base["aliases"], base["buildStatus"], base["memoryMB"]) == (
            "base",
            ["base"],
            "ready",
            1024,
        )


def test_logs_tell_the_lifecycle(client: httpx.Client) -> None:
    sandbox_id = client.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
    client.post(f"/sandboxes/{sandbox_id}/pause")
    v1 = client.get(f"/sandboxes/{sandbox_id}/logs").json()
    assert [line["line"] for line in v1["logs"]] == ["created from template base", "paused (api)"]
    v2 = client.get(f"/v2/sandboxes/{sandbox_id}/logs", params={"direction": "backward", "search": "paused"}).json()
    assert [entry["message"] for entry in v2["logs"]] == ["paused (api)"]


def test_listing_accepts_the_sdks_other_filters(client: httpx.Client) -> None:
    sandbox_id = client.post("/v2/sandboxes", json={"templateID": "base", "metadata": {"f": "1"}}).json()["sandboxID"]
    query = {"metadata": "f=1", "template": "base", "startedAfter": "2000-01-01T00:00:00+00:00", "order": "asc"}
    assert [s["sandboxID"] for s in client.get("/v2/sandboxes", params=query).json()] == [sandbox_id]
    assert client.get("/v2/sandboxes", params={**query, "template": "other"}).json() == []
