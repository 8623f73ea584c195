"""The E2B API's own OpenAPI document (`/openapi.json`) is complete, and the server answers as it says.

The fuzz test runs schemathesis over every operation of the document, against a real `agent-sandbox serve` holding
a real sandbox: part of the generated cases name that sandbox's id (`{sandbox_id}`), made again whenever a case
killed it, so kill, pause, connect, timeout, network, logs and metrics run their happy paths too. Its checks: no
5xx the document does not list (501: a refused feature; 503: `requireHealthyGuest`), no hang (a per-request
timeout), every answer's status, content type, headers and body as documented, and no route that answers without
a key when it needs one. Deterministic: a fixed seed, no example database, no shrinking, a bounded number of cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import schemathesis
from hypothesis import strategies as st
from litestar import Litestar
from litestar.routes import HTTPRoute

from activator import OPENAPI_PATH, e2b_openapi_config, e2b_router
from tests.server_fixtures import RunningServer, server_in_temp_dir

_LIVE = "livesandbox"  # stands for the live sandbox's id in generated cases, swapped in before the call
_CONFIG = {
    "seed": 14,
    "suppress-health-check": ["all"],
    "request-timeout": 30,  # seconds: a hang is a failure, not a stuck test
    "generation": {"max-examples": 25, "database": "none", "deterministic": True, "no-shrink": True},
    "phases": {"stateful": {"enabled": False}},
    "checks": {
        "enabled": False,
        # 501 (a refused feature) and 503 (`requireHealthyGuest`) are no failure where the document lists them.
        "not_a_server_error": {"enabled": True, "expected-statuses": ["1XX", "2XX", "3XX", "4XX", "501", "503"]},
        "status_code_conformance": {"enabled": True},
        "content_type_conformance": {"enabled": True},
        "response_headers_conformance": {"enabled": True},
        "response_schema_conformance": {"enabled": True},
        "ignored_auth": {"enabled": True},
        "unsupported_method": {"enabled": True},  # another method on a documented path: 405 with its `Allow`
        # Not `allow_header_conformance`: Litestar 2's automatic OPTIONS answer lists only the methods of the first
        # handler registered for a path (GET /sandboxes: "OPTIONS, POST"; litestar-org/litestar#4169, fixed in 3).
    },
}


class LiveSandbox:
    """A sandbox of the fuzzed server that is running or paused whenever a case names it."""

    def __init__(self, server: RunningServer) -> None:
        self._client = httpx.Client(base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=60)
        self._id = ""

    def ensure(self) -> str:
        """The sandbox's id, after a new one replaced it if a case killed it (or let it expire)."""
        if not self._id or self._client.get(f"/sandboxes/{self._id}").status_code == 404:
            made = self._client.post("/sandboxes", json={"templateID": "base", "timeout": 3600})
            made.raise_for_status()
            self._id = made.json()["sandboxID"]
        return self._id

    def close(self) -> None:
        self._client.close()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # The fuzzer sends requests without a key and with wrong ones on purpose (`ignored_auth`, negative cases): under
    # the per-address limit on failed key checks, most cases after the first minute would be 429s.
    with server_in_temp_dir(tmp_path_factory, "openapi-fuzz", "--signin-failures", "none") as server:
        yield server


@pytest.fixture(scope="module")
def live(fuzzed: RunningServer) -> Iterator[LiveSandbox]:
    sandbox = LiveSandbox(fuzzed)
    sandbox.ensure()
    yield sandbox
    sandbox.close()


def _app() -> Litestar:
    return Litestar([e2b_router()], openapi_config=e2b_openapi_config())


def _document() -> dict[str, Any]:
    """The OpenAPI document of the E2B routes, as the server generates it (the last test compares the two)."""
    return _app().openapi_schema.to_schema()


fuzz = schemathesis.openapi.from_dict(_document(), config=schemathesis.Config.from_dict(_CONFIG))


@fuzz.hook
def flatmap_path_parameters(context: schemathesis.HookContext, parameters: dict[str, Any] | None) -> Any:
    """Half the generated cases of a sandbox's operations name the live sandbox (the coverage phase's own cases,
    boundary values, name none)."""
    if not parameters or "sandbox_id" not in parameters:
        return st.just(parameters)
    return st.sampled_from([parameters, {**parameters, "sandbox_id": _LIVE}])


@fuzz.parametrize()
def test_every_operation_answers_as_its_document_says(
    case: schemathesis.Case[Any], fuzzed: RunningServer, live: LiveSandbox
) -> None:
    if case.path_parameters and case.path_parameters.get("sandbox_id") == _LIVE:
        case.path_parameters["sandbox_id"] = live.ensure()
    case.call_and_validate(base_url=fuzzed.url, headers={"X-API-Key": fuzzed.api_key})


def test_the_document_describes_every_e2b_route_with_its_answers() -> None:
    app = _app()
    document = app.openapi_schema.to_schema()
    served = {
        (route.path_format, method.lower())
        for route in app.routes
        if isinstance(route, HTTPRoute) and not route.path.startswith(OPENAPI_PATH)
        for method in route.route_handler_map if method != "OPTIONS"
    }  # fmt: skip
    paths: dict[str, dict[str, Any]] = document["paths"]
    described = {(path, method) for path, item in paths.items() for method in item if method != "parameters"}
    assert described == served
    error = {"$ref": "#/components/schemas/ErrorBody"}
    for path, method in sorted(served):
        operation = paths[path][method]
        assert operation.get("description"), f"{method} {path} has no description (the handler's docstring)"
        for status, answer in operation["responses"].items():
            if int(status) >= 400:
                assert answer["content"]["application/json"]["schema"] == error, f"{method} {path} {status}"
    assert document["components"]["securitySchemes"]["ApiKeyAuth"] == {
        "type": "apiKey", "name": "X-API-Key", "in": "header", "description": "An API key, `e2b_<32 hex>`.",
    }  # fmt: skip
    public = {(path, method) for path, method in served if "security" not in paths[path][method]}
    assert public == {("/health", "get"), ("/templates/{template_id}/files/{files_hash}", "put")}
    volume_content = {(path, method) for path, method in served if path.startswith("/volumecontent/")}
    assert len(volume_content) == 7
    for path, method in volume_content:  # the volume's token, not a key: no valid token is a 401, never a 429
        assert paths[path][method]["security"] == [{"VolumeToken": []}], f"{method} {path}"
        assert "401" in paths[path][method]["responses"], f"{method} {path}"
    for path, method in served - public - volume_content:  # the key check's: no valid key; too many failed checks
        assert {"401", "429"} <= set(paths[path][method]["responses"]), f"{method} {path}"


def test_the_served_document_is_the_generated_one(fuzzed: RunningServer) -> None:
    served = httpx.get(f"{fuzzed.url}{OPENAPI_PATH}")
    assert served.status_code == 200
    assert msgspec.json.decode(served.content) == _document()  # so what is fuzzed is what is served
