"""The MCP server at /mcp, driven by the official `mcp` client over streamable HTTP against `agent-sandbox serve`."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent

from tests.polling import wait_for
from tests.server_fixtures import REPO, RunningServer

pytestmark = pytest.mark.anyio

# The initialize handshake at the newest version it reaches, and the per-request envelope of 2026-07-28.
CLIENT_MODES = {"legacy": "2025-11-25", "2026-07-28": "2026-07-28"}
TOOLS = ["createSandbox", "getSandbox", "listSandbox", "deleteSandbox", "sandboxExecutor"]
AGENT_SESSION_TOOLS = [  # tests/test_mcp_agent_sessions.py
    "createAgentSession",
    "promptAgentSession",
    "getAgentSessionEvents",
    "replyAgentPermission",
    "listAgentSessions",
    "terminateAgentSession",
]
SANDBOX_TOOLS = ["run_command", "read_file", "write_file", "list_files", "get_url"]
NODE_SERVER = "require('http').createServer((req, res) => res.end('hello from node ' + req.url)).listen(8008);\n"


@asynccontextmanager
async def connect(server: RunningServer, *, key: str | None = None, mode: str = "legacy") -> AsyncIterator[Client]:
    """An MCP client session, authenticated the way `claude mcp add --header` does it."""
    headers = {"Authorization": f"Bearer {key or server.api_key}"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
    async with http, Client(streamable_http_client(f"{server.url}/mcp", http_client=http), mode=mode) as client:
        yield client


async def call(
    server: RunningServer, tool: str, arguments: dict[str, Any], *, key: str | None = None
) -> CallToolResult:
    async with connect(server, key=key) as client:
        return await client.call_tool(tool, arguments)


async def execute(server: RunningServer, sandbox_id: str, tool: str, arguments: dict[str, Any]) -> CallToolResult:
    return await call(server, "sandboxExecutor", {"sandboxId": sandbox_id, "tool": tool, "arguments": arguments})


def ok(result: CallToolResult) -> dict[str, Any]:
    """The structured result of a successful call, which its text repeats as JSON."""
    text = result.content[0].text if isinstance(result.content[0], TextContent) else ""
    assert not result.is_error, text
    structured: dict[str, Any] = result.structured_content
    assert json.loads(text) == structured
    return structured


def failed(result: CallToolResult) -> str:
    """The message of a tool error."""
    assert result.is_error, result.structured_content
    assert isinstance(result.content[0], TextContent)
    return result.content[0].text


async def create(server: RunningServer, **arguments: Any) -> dict[str, Any]:
    return ok(await call(server, "createSandbox", arguments))


@pytest.fixture(scope="module")
async def node_sandbox(server: RunningServer) -> AsyncIterator[dict[str, Any]]:
    """A sandbox-base-node sandbox as createSandbox returned it."""
    created = await create(server, template="sandbox-base-node", metadata={"suite": "mcp"})
    yield created
    await call(server, "deleteSandbox", {"sandboxId": created["sandboxId"]})


@pytest.mark.parametrize("mode", list(CLIENT_MODES))
async def test_the_tools_are_listed_with_object_schemas(server: RunningServer, mode: str) -> None:
    async def list_tools() -> tuple[str, list[Any]]:
        async with connect(server, mode=mode) as client:
            return client.protocol_version, (await client.list_tools()).tools

    version, tools = await list_tools()
    assert version == CLIENT_MODES[mode]
    assert [tool.name for tool in tools] == TOOLS + AGENT_SESSION_TOOLS
    schemas = {tool.name: tool.input_schema for tool in tools}
    assert all(schema["type"] == "object" for schema in schemas.values())
    assert schemas["sandboxExecutor"]["required"] == ["sandboxId", "tool"]
    assert "sandbox-base-node" in next(tool.description or "" for tool in tools if tool.name == "createSandbox")


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18"])
def test_older_handshake_versions_are_negotiated(server: RunningServer, version: str) -> None:
    headers = {"X-API-Key": server.api_key, "Accept": "application/json, text/event-stream"}
    initialize = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "old", "version": "1"}}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        answer = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize})
        assert answer.json()["result"]["protocolVersion"] == version
        listed = http.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers={"MCP-Protocol-Version": version},
        )
    assert [tool["name"] for tool in listed.json()["result"]["tools"]] == TOOLS + AGENT_SESSION_TOOLS


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'"),
        ({"Authorization": "Bearer e2b_" + "0" * 32}, "invalid API key"),
        ({"Authorization": "Basic dXNlcjo="}, "missing API key"),
        ({"X-API-Key": "not-a-key"}, "invalid API key"),
    ],
)
def test_a_request_without_a_valid_key_is_refused_before_mcp(
    server: RunningServer, headers: dict[str, str], message: str
) -> None:
    answer = httpx.post(f"{server.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == 'Bearer realm="agent-sandbox"'
    assert answer.json()["error"]["code"] == -32001
    assert message in answer.json()["error"]["message"]


def test_only_posts_to_mcp_itself_are_served(server: RunningServer) -> None:
    headers = {"X-API-Key": server.api_key, "Accept": "application/json, text/event-stream"}
    stream = httpx.get(f"{server.url}/mcp", headers=headers, timeout=10)
    assert (stream.status_code, stream.headers["allow"]) == (405, "POST, DELETE")
    assert httpx.post(f"{server.url}/mcp/tools", headers=headers, json={}).status_code == 404


async def test_the_official_client_reports_a_wrong_key(server: RunningServer) -> None:
    async def list_tools() -> None:
        async with connect(server, key="e2b_" + "1" * 32) as client:
            await client.list_tools()

    with pytest.raises(BaseExceptionGroup) as raised:
        await list_tools()
    assert raised.group_contains(MCPError, match="^invalid API key: send 'Authorization: Bearer <key>'")


async def test_the_product_page_example(server: RunningServer) -> None:
    """ "Create a sandbox from template sandbox-base-node, run a server on port 8008 in it and return the address"."""
    created = await create(server, template="sandbox-base-node")
    sandbox_id = created["sandboxId"]
    try:
        assert {tool["name"] for tool in created["tools"]} >= {"write_file", "run_command", "get_url"}
        ok(await execute(server, sandbox_id, "write_file", {"path": "server.js", "content": NODE_SERVER}))
        started = ok(
            await execute(server, sandbox_id, "run_command", {"command": "node server.js", "background": True})
        )
        assert started["pid"] > 0
        address = ok(await execute(server, sandbox_id, "get_url", {"port": 8008}))
        assert address["url"] == f"http://8008-{sandbox_id}.sandbox.localhost:{server.port}"
        assert fetch(address["url"] + "/hi") == "hello from node /hi"
        assert ok(await execute(server, sandbox_id, "get_url", {"port": 8008}))["listening"] is True
    finally:
        ok(await call(server, "deleteSandbox", {"sandboxId": sandbox_id}))


def fetch(url: str) -> str:
    """GET `url` through the gateway, retrying while the server inside is still starting."""

    def served() -> httpx.Response | None:
        answer = httpx.get(url, timeout=10)
        return answer if answer.status_code == 200 else None

    return wait_for(served, what=f"a 200 from {url}").text


def test_create_returns_the_sandbox_its_urls_and_its_tools(node_sandbox: dict[str, Any], server: RunningServer) -> None:
    assert node_sandbox["template"] == "sandbox-base-node"
    assert node_sandbox["state"] == "running"
    assert node_sandbox["metadata"] == {"suite": "mcp"}
    assert node_sandbox["urlPattern"] == f"http://{{port}}-{node_sandbox['sandboxId']}.sandbox.localhost:{server.port}"
    tools = {tool["name"]: tool for tool in node_sandbox["tools"]}
    assert list(tools) == SANDBOX_TOOLS  # no run_code: this template has no code interpreter
    assert tools["run_command"]["inputSchema"]["required"] == ["command"]
    assert tools["get_url"]["inputSchema"]["properties"]["port"]["maximum"] == 65535


async def test_get_describes_the_sandbox_with_its_tools(node_sandbox: dict[str, Any], server: RunningServer) -> None:
    got = ok(await call(server, "getSandbox", {"sandboxId": node_sandbox["sandboxId"]}))
    assert got["sandboxId"] == node_sandbox["sandboxId"]
    assert got["state"] == "running"
    assert got["tools"] == node_sandbox["tools"]


async def test_a_command_reports_its_exit_code_and_both_streams(
    node_sandbox: dict[str, Any], server: RunningServer
) -> None:
    command = {"command": 'node -e "console.log(process.env.WHO)"; echo oops >&2; exit 7', "envs": {"WHO": "me"}}
    result = ok(await execute(server, node_sandbox["sandboxId"], "run_command", command))
    assert result == {"exitCode": 7, "stdout": "me\n", "stderr": "oops\n"}


async def test_files_are_written_read_and_listed(node_sandbox: dict[str, Any], server: RunningServer) -> None:
    sandbox_id = node_sandbox["sandboxId"]
    written = ok(await execute(server, sandbox_id, "write_file", {"path": "notes/a.txt", "content": "héllo\n"}))
    assert written == {"path": "/home/user/notes/a.txt", "bytes": 7}
    read = ok(await execute(server, sandbox_id, "read_file", {"path": "/home/user/notes/a.txt"}))
    assert read == {"path": "/home/user/notes/a.txt", "size": 7, "encoding": "utf-8", "content": "héllo\n"}
    binary = {"path": "notes/b.bin", "content": "AAH/", "encoding": "base64"}
    ok(await execute(server, sandbox_id, "write_file", binary))
    assert ok(await execute(server, sandbox_id, "read_file", {"path": "notes/b.bin"}))["content"] == "AAH/"
    listed = ok(await execute(server, sandbox_id, "list_files", {"path": "notes"}))
    assert [(entry["name"], entry["type"], entry["size"]) for entry in listed["entries"]] == [
        ("a.txt", "file", 7),
        ("b.bin", "file", 3),
    ]
    home = ok(await execute(server, sandbox_id, "list_files", {"depth": 2}))
    assert {"path": "/home/user/notes/a.txt", "name": "a.txt", "type": "file", "size": 7} in home["entries"]


async def test_big_outputs_are_cut_with_a_marker(node_sandbox: dict[str, Any], server: RunningServer) -> None:
    sandbox_id = node_sandbox["sandboxId"]
    command = {"command": "seq 1 100000 | tee big.txt"}  # 588895 bytes
    stdout = ok(await execute(server, sandbox_id, "run_command", command))["stdout"]
    assert stdout.startswith("1\n2\n3\n")
    assert "\n[... 523359 bytes of stdout cut here: at most 65536 bytes per stream" in stdout
    assert stdout.endswith("99999\n100000\n")
    content = ok(await execute(server, sandbox_id, "read_file", {"path": "big.txt"}))["content"]
    assert content.endswith("\n[... 326751 bytes of big.txt cut here: read_file returns the first 262144 bytes; "
                            "use run_command (tail, sed -n, grep) for the rest ...]\n")  # fmt: skip


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("getSandbox", {"sandboxId": "nosuchsandbox"}, "doesn't exist or you don't have access to it. listSandbox"),
        ("sandboxExecutor", {"sandboxId": "nosuchsandbox", "tool": "run_command"}, "doesn't exist"),
        ("createSandbox", {"template": "nope"}, "template 'nope' not found; the templates are: base, "),
        ("createSandbox", {"timeout": "long"}, "invalid arguments for createSandbox: Expected `int`, got `str`"),
        ("getSandbox", {}, "invalid arguments for getSandbox: Object missing required field `sandboxId`"),
    ],
)
async def test_control_errors_are_tool_errors(
    server: RunningServer, tool: str, arguments: dict[str, Any], message: str
) -> None:
    assert message in failed(await call(server, tool, arguments))


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("format_disk", {}, "this sandbox has no tool 'format_disk'; its tools are: run_command, read_file, "),
        ("run_code", {"code": "1"}, "this sandbox has no tool 'run_code'"),
        (
            "run_command",
            {"command": 5},
            "invalid arguments for run_command: Expected `str`, got `int` - at `$.command`",
        ),
        ("run_command", {"cmd": "ls"}, "invalid arguments for run_command: Object contains unknown field `cmd`"),
        ("get_url", {"port": 70000}, "Expected `int` <= 65535 - at `$.port`"),
        ("read_file", {"path": "/no/such/file"}, "'/no/such/file' does not exist in the sandbox"),
        ("list_files", {"path": "/no/such/dir"}, "'/no/such/dir' does not exist in the sandbox"),
        ("run_command", {"command": "echo started; sleep 30", "timeout": 1}, "timeout of 1 s and was killed"),
        ("run_command", {"command": "pwd", "cwd": "/no/such/dir"}, "cwd '/no/such/dir' does not exist"),
    ],
)
async def test_sandbox_tool_errors_are_tool_errors(
    node_sandbox: dict[str, Any], server: RunningServer, tool: str, arguments: dict[str, Any], message: str
) -> None:
    assert message in failed(await execute(server, node_sandbox["sandboxId"], tool, arguments))


async def test_a_timed_out_command_reports_its_output_so_far(
    node_sandbox: dict[str, Any], server: RunningServer
) -> None:
    arguments = {"command": "echo started; sleep 30", "timeout": 1}
    assert failed(await execute(server, node_sandbox["sandboxId"], "run_command", arguments)).endswith(
        "so far:\nstarted\n"
    )


async def test_an_unknown_tool_name_is_a_protocol_error(server: RunningServer) -> None:
    with pytest.raises(BaseExceptionGroup) as raised:
        await call(server, "formatDisk", {})
    assert raised.group_contains(MCPError, match="^Unknown tool: formatDisk$")


async def test_list_filters_by_metadata_and_state(node_sandbox: dict[str, Any], server: RunningServer) -> None:
    run = uuid.uuid4().hex
    first = (await create(server, metadata={"run": run, "role": "web"}))["sandboxId"]
    second = (await create(server, metadata={"run": run, "role": "db"}))["sandboxId"]
    try:

        async def listed(**arguments: Any) -> list[str]:
            return [sandbox["sandboxId"] for sandbox in ok(await call(server, "listSandbox", arguments))["sandboxes"]]

        assert await listed(metadata={"run": run}) == [second, first]  # newest first
        assert await listed(metadata={"run": run, "role": "db"}) == [second]
        assert await listed(metadata={"run": run}, state=["paused"]) == []
        assert node_sandbox["sandboxId"] in await listed(state=["running"])
    finally:
        for sandbox_id in (first, second):
            await call(server, "deleteSandbox", {"sandboxId": sandbox_id})


async def test_a_deleted_sandbox_is_gone(server: RunningServer) -> None:
    sandbox_id = (await create(server))["sandboxId"]
    assert ok(await call(server, "deleteSandbox", {"sandboxId": sandbox_id})) == {
        "sandboxId": sandbox_id,
        "deleted": True,
    }
    assert "doesn't exist" in failed(await call(server, "getSandbox", {"sandboxId": sandbox_id}))
    assert "doesn't exist" in failed(await call(server, "deleteSandbox", {"sandboxId": sandbox_id}))


async def test_another_key_sees_none_of_the_sandboxes(node_sandbox: dict[str, Any], server: RunningServer) -> None:
    command = [
        sys.executable,
        "-m",
        "cli",
        "keys",
        "create",
        "--name",
        "mcp-other",
        "--data-dir",
        str(server.data_dir),
    ]
    other = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout.split()[0]
    sandbox_id = node_sandbox["sandboxId"]
    assert ok(await call(server, "listSandbox", {}, key=other)) == {"sandboxes": []}
    assert "doesn't exist" in failed(await call(server, "getSandbox", {"sandboxId": sandbox_id}, key=other))
    arguments = {"sandboxId": sandbox_id, "tool": "read_file", "arguments": {"path": "server.js"}}
    assert "doesn't exist" in failed(await call(server, "sandboxExecutor", arguments, key=other))


async def test_a_paused_sandbox_is_woken_by_a_tool_call(server: RunningServer) -> None:
    sandbox_id = (await create(server))["sandboxId"]
    try:
        ok(await execute(server, sandbox_id, "write_file", {"path": "kept.txt", "content": "still here"}))
        paused = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/pause", headers={"X-API-Key": server.api_key})
        assert paused.status_code == 204, paused.text
        assert ok(await call(server, "getSandbox", {"sandboxId": sandbox_id}))["state"] == "paused"
        result = ok(await execute(server, sandbox_id, "run_command", {"command": "cat kept.txt"}))
        assert result["stdout"] == "still here"
        assert ok(await call(server, "getSandbox", {"sandboxId": sandbox_id}))["state"] == "running"
    finally:
        await call(server, "deleteSandbox", {"sandboxId": sandbox_id})


async def test_run_code_runs_in_the_code_interpreter_template(server: RunningServer) -> None:
    created = await create(server, template="code-interpreter-v1")
    sandbox_id = created["sandboxId"]
    try:
        assert [tool["name"] for tool in created["tools"]] == [*SANDBOX_TOOLS, "run_code"]
        first = ok(await execute(server, sandbox_id, "run_code", {"code": "x = 21\nprint('hi')\nx * 2"}))
        assert first == {"stdout": "hi\n", "stderr": "", "results": ["42"]}
        raised = ok(await execute(server, sandbox_id, "run_code", {"code": "x / 0"}))  # x is still defined
        assert raised["error"]["name"] == "ZeroDivisionError"
        assert "\x1b[" not in raised["error"]["traceback"]
    finally:
        await call(server, "deleteSandbox", {"sandboxId": sandbox_id})
