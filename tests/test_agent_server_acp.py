"""The agent server's sandbox-agent 0.4.2 surface, over HTTP against a real executor and the builtin mock agent.

Status codes and bodies are upstream's (coding-agents.md §2, §3), except where upstream is broken: DELETE
returns at once and ends the agent's process group, and replay reaches back to the first event.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_fixtures import AgentServer, processes_with, read_sse, run_agent_server
from tests.polling import wait_for

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


@pytest.fixture(scope="module")
def agents() -> Iterator[AgentServer]:
    with run_agent_server() as server:
        yield server


@pytest.fixture
def client(agents: AgentServer) -> Iterator[httpx.Client]:
    with agents.client() as client:
        yield client


def _rpc(client: httpx.Client, server_id: str, body: dict[str, Any], agent: str | None = "mock") -> httpx.Response:
    query = f"?agent={agent}" if agent else ""
    return client.post(f"/v1/acp/{server_id}{query}", json={"jsonrpc": "2.0", **body}, headers=JSON_HEADERS)


def _open_session(client: httpx.Client, server_id: str, cwd: str = "/tmp") -> str:
    assert (
        _rpc(client, server_id, {"id": 0, "method": "initialize", "params": {"protocolVersion": 1}}).status_code == 200
    )
    created = _rpc(
        client, server_id, {"id": 1, "method": "session/new", "params": {"cwd": cwd, "mcpServers": []}}, None
    )
    assert created.status_code == 200, created.text
    return str(created.json()["result"]["sessionId"])


def _problem(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:sandbox-agent:error:{kind}"
    assert body["status"] == status
    return body


def test_every_route_but_the_root_needs_the_sandboxs_token_as_a_bearer(agents: AgentServer) -> None:
    with httpx.Client(base_url=agents.url) as anonymous:
        assert anonymous.get("/").status_code == 200
        _problem(anonymous.get("/v1/health"), 401, "token_invalid")
        _problem(anonymous.get("/v1/health", headers={"Authorization": f"bearer {agents.token}"}), 401, "token_invalid")
        _problem(anonymous.get("/v1/agents", headers={"Authorization": "Bearer wrong"}), 401, "token_invalid")
        healthy = anonymous.get("/v1/health", headers={"Authorization": f"Bearer {agents.token}"})
    assert healthy.json() == {"status": "ok"}


def test_agents_lists_every_agent_with_its_capabilities_and_says_why_one_cannot_run(client: httpx.Client) -> None:
    listing = client.get("/v1/agents").json()["agents"]
    by_id = {agent["id"]: agent for agent in listing}
    assert set(by_id) == {"claude", "codex", "opencode", "pi", "amp", "cursor", "mock"}
    assert all(len(agent["capabilities"]) == 18 for agent in listing)
    assert by_id["mock"]["installed"] is True
    assert "ampcode.com" in by_id["amp"]["reason"]
    assert "npm" in by_id["cursor"]["reason"]
    assert "configOptions" not in by_id["claude"]
    with_config = client.get("/v1/agents/codex", params={"config": "true"}).json()
    assert {option["category"] for option in with_config["configOptions"]} == {"mode"}
    _problem(client.get("/v1/agents/nosuch"), 400, "unsupported_agent")


def test_acp_requests_are_refused_in_upstreams_shapes(client: httpx.Client) -> None:
    missing = _problem(_rpc(client, "refusals", {"id": 1, "method": "initialize"}, agent=None), 400, "invalid_request")
    assert "missing required 'agent' query parameter" in missing["detail"]
    _problem(
        client.post("/v1/acp/refusals?agent=mock", content=b"{}", headers={"Accept": "application/json"}),
        415,
        "unsupported_media_type",
    )
    _problem(
        client.post("/v1/acp/refusals?agent=mock", json={}, headers={"Accept": "text/plain"}), 406, "not_acceptable"
    )
    not_json = client.post("/v1/acp/refusals?agent=mock", content=b"{nope", headers=JSON_HEADERS)
    assert "invalid JSON body" in _problem(not_json, 400, "invalid_request")["detail"]
    _problem(_rpc(client, "refusals", {"id": 1, "method": "initialize"}, agent="nosuch"), 400, "unsupported_agent")
    _problem(client.get("/v1/acp/never-posted", headers={"Accept": "text/event-stream"}), 404, "session_not_found")
    _problem(_rpc(client, "refusals", {"id": 1, "method": "initialize"}, agent="claude"), 400, "agent_not_installed")
    assert client.get("/v1/nosuch").status_code == 404


def test_a_server_keeps_its_agent_and_not_json_rpc_is_accepted_and_ignored(client: httpx.Client) -> None:
    _open_session(client, "keeps-agent")
    conflict = _problem(_rpc(client, "keeps-agent", {"id": 5, "method": "initialize"}, agent="codex"), 409, "conflict")
    assert "already exists for agent 'mock'; requested 'codex'" in conflict["detail"]
    not_rpc = client.post("/v1/acp/keeps-agent", json={"foo": 1}, headers=JSON_HEADERS)
    assert not_rpc.status_code == 202
    _problem(client.get("/v1/acp/keeps-agent", headers={"Accept": "application/json"}), 406, "not_acceptable")
    assert client.delete("/v1/acp/keeps-agent").status_code == 204


def test_responses_come_on_the_post_and_on_the_stream_and_replay_starts_after_last_event_id(
    client: httpx.Client,
) -> None:
    session_id = _open_session(client, "replay")
    frames = read_sse(client, "GET", "/v1/acp/replay", until=lambda f: f.id == 2, timeout=10)
    assert [f.event for f in frames] == ["message", "message"]
    assert [f.id for f in frames] == [1, 2]
    assert frames[1].data["result"]["sessionId"] == session_id
    prompt = {
        "id": 2,
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]},
    }
    answer = _rpc(client, "replay", prompt, None)
    assert answer.json()["result"]["stopReason"] == "end_turn"
    after = read_sse(
        client, "GET", "/v1/acp/replay", until=lambda f: f.data.get("id") == 2, headers={"Last-Event-ID": "2"}
    )
    assert after[0].id == 3
    kinds = [f.data["params"]["update"]["sessionUpdate"] for f in after if f.data.get("method") == "session/update"]
    assert "agent_message_chunk" in kinds
    listing = client.get("/v1/acp").json()["servers"]
    assert {"serverId": "replay", "agent": "mock"}.items() <= next(
        s for s in listing if s["serverId"] == "replay"
    ).items()
    client.delete("/v1/acp/replay")


def test_replay_reaches_back_to_the_first_event_past_upstreams_1024(client: httpx.Client) -> None:
    session_id = _open_session(client, "long")
    text = " ".join(f"w{n}" for n in range(4500))  # 1500 chunks of three words, twice (thought and reply)
    prompt = {
        "id": 2,
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
    }
    assert _rpc(client, "long", prompt, None).status_code == 200
    frames = read_sse(client, "GET", "/v1/acp/long", until=lambda f: f.data.get("id") == 2, timeout=60)
    assert len(frames) > 3000
    assert [f.id for f in frames] == list(range(1, len(frames) + 1))
    client.delete("/v1/acp/long")


def test_a_permission_request_is_answered_by_posting_the_result(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _open_session(client, "permission", cwd=str(tmp_path))
    text = "write it\n$ echo approved > made.txt"
    prompt = {
        "id": 2,
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
    }
    with httpx.Client(base_url=client.base_url, headers=client.headers, timeout=30) as other:
        import threading

        answers: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: answers.append(_rpc(other, "permission", prompt, None)))
        waiter.start()
        asked = read_sse(
            client, "GET", "/v1/acp/permission", until=lambda f: f.data.get("method") == "session/request_permission"
        )
        request = asked[-1].data
        assert {option["kind"] for option in request["params"]["options"]} >= {"allow_once", "reject_once"}
        reply = {"id": request["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}}
        assert _rpc(client, "permission", reply, None).status_code == 202
        waiter.join(30)
    assert answers[0].json()["result"]["stopReason"] == "end_turn"
    assert (tmp_path / "made.txt").read_text() == "approved\n"
    client.delete("/v1/acp/permission")


def test_delete_answers_at_once_and_ends_the_agents_whole_process_group(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _open_session(client, "teardown", cwd=str(tmp_path))
    client.post(
        "/v1/acp/teardown",
        json={
            "jsonrpc": "2.0",
            "id": 7,
            "method": "session/set_mode",
            "params": {"sessionId": session_id, "modeId": "bypass"},
        },
        headers=JSON_HEADERS,
    )
    marker = f"agent-sleep-{os.getpid()}-{time.monotonic_ns()}"
    text = f"$ sleep 300; echo {marker}"  # the shell stays, its command line naming the marker
    prompt = {
        "jsonrpc": "2.0",
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]},
    }
    assert (
        client.post("/v1/acp/teardown", json=prompt, headers=JSON_HEADERS).status_code == 202
    )  # a notification: no wait
    wait_for(lambda: processes_with(marker), what="the tool's sleep to start")
    assert client.delete("/v1/acp/teardown").status_code == 204  # upstream's never returns
    assert not processes_with(marker)
    assert client.delete("/v1/acp/teardown").status_code == 204  # an unknown id too
    assert all(server["serverId"] != "teardown" for server in client.get("/v1/acp").json()["servers"])


def test_the_agents_exit_is_the_last_event_of_its_stream(client: httpx.Client) -> None:
    session_id = _open_session(client, "exits")
    client.post(
        "/v1/acp/exits",
        json={
            "jsonrpc": "2.0",
            "id": 3,
            "method": "session/set_mode",
            "params": {"sessionId": session_id, "modeId": "bypass"},
        },
        headers=JSON_HEADERS,
    )
    prompt = {
        "id": 4,
        "method": "session/prompt",
        "params": {"sessionId": session_id, "prompt": [{"type": "text", "text": "$ kill -9 $PPID"}]},
    }
    died = _rpc(client, "exits", prompt, None)
    _problem(died, 502, "agent_process_exited")
    frames = read_sse(client, "GET", "/v1/acp/exits", until=lambda f: f.data.get("method") == "_adapter/agent_exited")
    assert frames[-1].data["params"]["success"] is False
    client.delete("/v1/acp/exits")
