"""`GET /v1/openapi.json` describes every route the agent port serves, with the wire types' own schemas."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from executor._agents._openapi import OPERATIONS, document
from executor.agent_api import CreateSessionRequest
from tests.agent_fixtures import run_agent_server


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_the_document_lists_every_served_route_and_its_schemas_resolve() -> None:
    with run_agent_server() as server, server.client() as client:
        served = client.get("/v1/openapi.json")
        anonymous = httpx.get(f"{server.url}/v1/openapi.json")
    assert served.status_code == 200
    assert anonymous.status_code == 401  # like every route but /
    document = served.json()
    assert document["openapi"] == "3.1.0"
    operations = {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}
    assert operations == set(OPERATIONS)  # which `document()` checks against the routing table
    assert {"POST /v1/acp/{server_id}", "GET /v1/sessions/{session_id}/events/sse", "GET /v1/fs/file"} <= operations
    schemas = document["components"]["schemas"]
    for ref in _refs(document["paths"]):
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    create = document["paths"]["/v1/sessions/{session_id}"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CreateSessionRequest"
    }
    assert create["parameters"] == [
        {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    # The schema is the wire's: the required field, no unknown ones (a create with one is a 400).
    assert schemas["CreateSessionRequest"]["required"] == ["agent"]
    assert schemas["CreateSessionRequest"]["additionalProperties"] is False
    assert set(schemas["CreateSessionRequest"]["properties"]) == {
        CreateSessionRequest.__struct_encode_fields__[i] for i in range(len(CreateSessionRequest.__struct_fields__))
    }
    assert document["paths"]["/"]["get"]["security"] == []


def test_a_route_without_an_operation_or_an_operation_without_a_route_is_an_error() -> None:
    routes = [(key.split(" ", 1)[1], [key.split(" ", 1)[0]]) for key in OPERATIONS]
    assert len(document(routes)["paths"]) == len({path for path, _ in routes})
    with pytest.raises(ValueError, match=re.escape("routes without an operation: {'GET /v1/new'}")):
        document([*routes, ("/v1/new", ["GET"])])
    with pytest.raises(ValueError, match=re.escape("stale: {'GET /v1/health'}")):
        document([route for route in routes if route[0] != "/v1/health"])
