"""E2B's MCP gateway: `Sandbox.create(mcp={...})` with the real SDK, then the official MCP client on port 50005.

The SDK asks for the `mcp-gateway` template, runs `mcp-gateway --config '<json>'` in it as root and
raises `SandboxException("Failed to start MCP gateway: <stderr>")` when that fails. The client reaches the
gateway the way `get_mcp_url()` does, through the sandbox's port 50005 (here by the routing headers, the
server being plain HTTP on one host), with `Authorization: Bearer <get_mcp_token()>`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from e2b import Sandbox, SandboxException
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import TextContent

from tests.server_fixtures import RunningServer

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def gateway(server: RunningServer, sandbox: Sandbox, token: str | None) -> AsyncIterator[Client]:
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "50005"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120))
    async with http, Client(streamable_http_client(f"{server.url}/mcp", http_client=http)) as client:
        yield client


def text(content: object) -> str:
    assert isinstance(content, TextContent)
    return content.text


async def test_the_gateway_serves_the_configured_servers_tools(e2b_env: RunningServer) -> None:
    sandbox = Sandbox.create(mcp={"filesystem": {"paths": ["/home/user"]}, "time": {}})
    try:
        assert sandbox.get_info().template_id == "mcp-gateway"
        assert sandbox.get_mcp_url() == f"https://{sandbox.get_host(50005)}/mcp"
        token = sandbox.get_mcp_token()
        assert token
        assert sandbox.files.read("/etc/mcp-gateway/.token", user="root") == token
        sandbox.files.write("/home/user/note.txt", "written by the sdk")
        async with gateway(e2b_env, sandbox, token) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"read_text_file", "list_directory", "get_current_time"} <= names
            read = await client.call_tool("read_text_file", {"path": "/home/user/note.txt"})
            assert not read.is_error
            assert text(read.content[0]) == "written by the sdk"
            now = await client.call_tool("get_current_time", {"timezone": "UTC"})
            assert '"timezone": "UTC"' in text(now.content[0])
            outside = await client.call_tool("read_text_file", {"path": "/etc/passwd"})
            assert outside.is_error  # outside the configured paths
    finally:
        sandbox.kill()


async def test_every_server_of_the_catalog_starts_and_offers_its_tools(e2b_env: RunningServer) -> None:
    config: dict[str, Any] = {"everything": {}, "git": {}, "memory": {}, "sequentialthinking": {}}
    sandbox = Sandbox.create(mcp=config)
    try:
        async with gateway(e2b_env, sandbox, sandbox.get_mcp_token()) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"echo", "git_status", "create_entities", "sequentialthinking"} <= names
            echoed = await client.call_tool("echo", {"message": "through the gateway"})
            assert "through the gateway" in text(echoed.content[0])
            made = await client.call_tool("create_entities", {"entities": [
                {"name": "sandbox", "entityType": "thing", "observations": ["runs here"]},
            ]})  # fmt: skip
            assert not made.is_error
    finally:
        sandbox.kill()


async def test_the_gateway_refuses_a_request_without_its_token(e2b_env: RunningServer) -> None:
    sandbox = Sandbox.create(mcp={"time": {}})
    try:
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "50005"}
        for authorization in (None, "Bearer wrong"):
            sent = headers if authorization is None else {**headers, "Authorization": authorization}
            answer = httpx.post(f"{e2b_env.url}/mcp", headers=sent, json={}, timeout=30)
            assert answer.status_code == 401
            assert "Bearer" in answer.json()["error"]
    finally:
        sandbox.kill()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"notion": {"internalIntegrationToken": "x"}}, "server 'notion' is not available on this server"),
        ({"github/e2b-dev/mcp-server": {"runCmd": "npm start"}}, "cloned from GitHub, which this server cannot"),
        ({"filesystem": {}}, "server 'filesystem': 'paths' must name at least one directory"),
    ],
)
def test_a_server_that_cannot_run_here_fails_the_create_with_the_reason(
    e2b_env: RunningServer, config: dict[str, object], message: str
) -> None:
    before = {info.sandbox_id for info in Sandbox.list().next_items()}
    with pytest.raises(SandboxException, match="Failed to start MCP gateway: mcp-gateway: ") as raised:
        Sandbox.create(mcp=config)
    assert message in str(raised.value)
    assert "available here: everything, filesystem, git, memory, sequentialthinking, time" in str(raised.value) or (
        "paths" in message
    )
    assert {info.sandbox_id for info in Sandbox.list().next_items()} == before  # the SDK killed it
