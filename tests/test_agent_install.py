"""`POST /v1/agents/{agent}/install`, and a real agent from npm driven through the universal session API.

The install test is one of the few that reach a registry (npm, as a user's sandbox would): it installs
claude-agent-acp (Claude Code's ACP adapter, 77 MB) into a temporary agents directory with the Node.js of
the test environment, then runs a turn of the real Claude Code against the scripted model server on
loopback: the model asks for its shell command, the session asks for permission, the reply lets it run,
and the file the command writes is there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from tests.agent_fixtures import node_bin, run_agent_server, session_events, wait_session_event
from tests.scripted_model import ScriptedModel

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
TRUST = {name: os.environ[name] for name in ("NODE_EXTRA_CA_CERTS",) if name in os.environ}
"""What a sandbox's user sets where the registry is reached through a TLS-intercepting proxy (as on this machine)."""


def _problem(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:sandbox-agent:error:{kind}"
    return body


def test_installs_that_cannot_happen_are_refused_in_upstreams_shapes(tmp_path: Path) -> None:
    empty, agents = tmp_path / "empty", tmp_path / "agents"
    empty.mkdir()
    with run_agent_server(agents_dir=agents, path=str(empty)) as server, server.client() as client:
        mock = client.post("/v1/agents/mock/install", json={}).json()
        assert mock["already_installed"] is True
        assert mock["artifacts"][0]["path"].endswith("/executor/_agents/mock.py")
        no_npm = _problem(client.post("/v1/agents/codex/install", json={}), 500, "install_failed")
        assert "npm is not on this sandbox's PATH" in no_npm["detail"]
        assert no_npm["agent"] == "codex"
        amp = _problem(client.post("/v1/agents/amp/install", json={}), 500, "install_failed")
        assert "ampcode.com" in amp["detail"]
        _problem(client.post("/v1/agents/nosuch/install", json={}), 400, "unsupported_agent")
        bad = client.post("/v1/agents/claude/install", json={"agentVersion": "1.0; rm -rf /"})
        assert "invalid version" in _problem(bad, 400, "invalid_request")["detail"]
        disagree = client.post(
            "/v1/agents/claude/install", json={"agentVersion": "1.0.0", "agentProcessVersion": "2.0.0"}
        )
        assert "must agree" in _problem(disagree, 400, "invalid_request")["detail"]
        _problem(client.post("/v1/agents/claude/install", json={"force": True}), 400, "invalid_request")
        no_body = client.post("/v1/agents/claude/install", content=b"", headers={"Content-Type": "text/plain"})
        _problem(no_body, 415, "unsupported_media_type")
        listed = {agent["id"]: agent for agent in client.get("/v1/agents").json()["agents"]}
        assert listed["claude"]["installed"] is False
        assert listed["claude"]["reason"].endswith(f"in {agents / 'claude'}")


def test_claude_installed_from_npm_runs_a_turn_against_the_scripted_model(tmp_path: Path) -> None:
    agents, work = tmp_path / "agents", tmp_path / "work"
    work.mkdir()
    path = f"{node_bin(tmp_path / 'bin')}:{SYSTEM_PATH}"
    with (
        ScriptedModel() as model,
        run_agent_server(agents_dir=agents, path=path, env_vars=TRUST) as server,
        server.client() as client,
    ):
        client.timeout = httpx.Timeout(600)
        installed = client.post("/v1/agents/claude/install", json={})
        assert installed.status_code == 200, installed.text
        assert installed.json()["already_installed"] is False
        (artifact,) = installed.json()["artifacts"]
        assert artifact["path"] == str(agents / "claude" / "bin" / "claude-agent-acp")
        assert artifact["source"] == "npm:@zed-industries/claude-agent-acp"
        assert artifact["version"] == "0.23.1"
        assert client.post("/v1/agents/claude/install", json={}).json()["already_installed"] is True
        assert client.get("/v1/agents/claude").json()["installed"] is True

        env = {"ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-ant-scripted-test", "PATH": path}
        created = client.post("/v1/sessions/claude-1", json={"agent": "claude", "directory": str(work), "env": env})
        assert created.status_code == 200, created.text
        assert client.post("/v1/sessions/claude-1/messages", json={"message": "write the file"}).status_code == 204
        events = wait_session_event(client, "claude-1", "permission.requested", within=180)
        asked = next(event["data"] for event in events if event["type"] == "permission.requested")
        reply = client.post(f"/v1/sessions/claude-1/permissions/{asked['permission_id']}/reply", json={"reply": "once"})
        assert reply.status_code == 204
        events = wait_session_event(client, "claude-1", "turn.ended", within=180)
        assert events[-1]["data"]["phase"] == "completed", events[-3:]
        assert (work / "hello.txt").read_text() == "hello from scripted model\n"
        replies = "".join(e["data"]["delta"] for e in events if e["type"] == "item.delta")
        assert "DONE. tool output: hello from scripted model" in replies
        assert any(request["path"].startswith("/v1/messages") for request in model.requests)
        assert b"sk-ant-scripted-test" not in (server_state_log(client, "claude-1"))
        assert client.post("/v1/sessions/claude-1/terminate").status_code == 204
        assert session_events(client, "claude-1")[-1]["type"] == "session.ended"


def server_state_log(client: httpx.Client, session_id: str) -> bytes:
    """Everything the session's log holds, as served."""
    return client.get(f"/v1/sessions/{session_id}/events", params={"limit": 10_000}).content
