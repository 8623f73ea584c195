"""The universal session API (coding-agents.md §4) against a real executor and the builtin mock agent.

A session is created with an agent and its settings, takes messages one turn at a time, answers the
agent's permission requests (by reply, by timeout with its default, by cancel or terminate), and keeps
its event log on disk: a second executor on the same state directory serves the same events and goes on
numbering after them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor._agents._sessions import Session, SessionRecord, SessionTerminated
from executor.agent_api import CreateSessionRequest
from tests.agent_fixtures import (
    AgentServer,
    processes_with,
    read_sse,
    run_agent_server,
    session_events,
    wait_session_event,
)
from tests.polling import wait_for


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with run_agent_server(tmp_path_factory.mktemp("agent-state")) as server:
        yield server


@pytest.fixture
def client(agents: AgentServer) -> Iterator[httpx.Client]:
    with agents.client() as client:
        yield client


def _create(client: httpx.Client, directory: Path, **options: Any) -> str:
    session_id = f"s-{uuid.uuid4().hex[:10]}"
    created = client.post(f"/v1/sessions/{session_id}", json={"agent": "mock", "directory": str(directory), **options})
    assert created.status_code == 200, created.text
    assert created.json()["healthy"] is True
    assert created.json()["nativeSessionId"].startswith("mock-")
    return session_id


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def _kinds(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        event["data"]["item"]
        for event in events
        if event["type"] == "item.completed" and event["data"]["item"]["kind"] == kind
    ]


def _problem(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:sandbox-agent:error:{kind}"
    return body


def test_an_approved_tool_call_runs_and_its_events_come_in_order(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _create(client, tmp_path)
    assert (
        client.post(f"/v1/sessions/{session_id}/messages", json={"message": "go\n$ echo made > made.txt"}).status_code
        == 204
    )
    asked = wait_session_event(client, session_id, "permission.requested")[-1]
    permission_id = asked["data"]["permission_id"]
    assert asked["data"]["action"] == "Run `echo made > made.txt`"
    assert client.get(f"/v1/sessions/{session_id}").json()["pendingPermissions"] == [permission_id]
    assert not (tmp_path / "made.txt").exists()
    assert (
        client.post(f"/v1/sessions/{session_id}/permissions/{permission_id}/reply", json={"reply": "once"}).status_code
        == 204
    )
    events = wait_session_event(client, session_id, "turn.ended")
    assert (tmp_path / "made.txt").read_text() == "made\n"
    assert "pendingPermissions" not in client.get(f"/v1/sessions/{session_id}").json()  # none left
    assert [event["sequence"] for event in events] == list(range(1, len(events) + 1))
    types = _types(events)
    assert types[0] == "session.started"
    assert types.index("turn.started") < types.index("permission.requested") < types.index("permission.resolved")
    assert types[-1] == "turn.ended"
    assert events[-1]["data"] == {
        "phase": "completed",
        "stop_reason": "end_turn",
        "usage": {"inputTokens": 6, "outputTokens": 5, "totalTokens": 11},
    }
    resolved = next(event["data"] for event in events if event["type"] == "permission.resolved")
    assert resolved["status"] == "accept"
    assert resolved["metadata"] == {"reply": "once", "option_id": "allow", "resolved_by": "client"}
    (result,) = _kinds(events, "tool_result")
    (call,) = _kinds(events, "tool_call")
    assert result["parent_id"] == call["item_id"]
    assert result["status"] == "completed"
    messages = [item for item in _kinds(events, "message") if item["content"][0]["type"] == "text"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    (thought,) = (item for item in _kinds(events, "message") if item["content"][0]["type"] == "reasoning")
    assert thought["content"][0]["text"].startswith("Thinking about: go")
    assert messages[1]["content"][0]["text"] == "Ran 1 command(s)."
    deltas = "".join(
        e["data"]["delta"]
        for e in events
        if e["type"] == "item.delta" and e["data"]["item_id"] == messages[1]["item_id"]
    )
    assert deltas == "Ran 1 command(s)."
    assert all(event["session_id"] == session_id for event in events)


def test_a_rejected_tool_call_does_not_run(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _create(client, tmp_path)
    client.post(f"/v1/sessions/{session_id}/messages", json={"message": "$ touch never.txt"})
    permission_id = wait_session_event(client, session_id, "permission.requested")[-1]["data"]["permission_id"]
    assert (
        client.post(
            f"/v1/sessions/{session_id}/permissions/{permission_id}/reply", json={"reply": "reject"}
        ).status_code
        == 204
    )
    events = wait_session_event(client, session_id, "turn.ended")
    assert not (tmp_path / "never.txt").exists()
    (result,) = _kinds(events, "tool_result")
    assert result["status"] == "failed"
    again = client.post(f"/v1/sessions/{session_id}/permissions/{permission_id}/reply", json={"reply": "once"})
    assert "no pending permission request" in _problem(again, 400, "invalid_request")["detail"]
    bad = client.post(f"/v1/sessions/{session_id}/permissions/{permission_id}/reply", json={"reply": "maybe"})
    _problem(bad, 400, "invalid_request")


def test_an_unanswered_permission_takes_the_sessions_default_when_it_times_out(
    client: httpx.Client, tmp_path: Path
) -> None:
    rejecting = _create(client, tmp_path, permissionTimeoutMs=1000)
    allowing = _create(client, tmp_path, permissionTimeoutMs=1000, permissionDefault="once")
    client.post(f"/v1/sessions/{rejecting}/messages", json={"message": "$ touch rejected.txt"})
    client.post(f"/v1/sessions/{allowing}/messages", json={"message": "$ touch allowed.txt"})
    for session_id, status in ((rejecting, "reject"), (allowing, "accept")):
        events = wait_session_event(client, session_id, "turn.ended")
        resolved = next(event["data"] for event in events if event["type"] == "permission.resolved")
        assert resolved["status"] == status
        assert resolved["metadata"]["resolved_by"] == "timeout"
    assert not (tmp_path / "rejected.txt").exists()
    assert (tmp_path / "allowed.txt").exists()
    _problem(
        client.post("/v1/sessions/x-bad-timeout", json={"agent": "mock", "permissionTimeoutMs": 10}),
        400,
        "invalid_request",
    )


def test_a_second_message_while_a_turn_runs_is_a_409_and_the_turn_goes_on(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _create(client, tmp_path, permissionMode="bypass")
    assert client.post(f"/v1/sessions/{session_id}/messages", json={"message": "$ sleep 2"}).status_code == 204
    assert client.get(f"/v1/sessions/{session_id}").json()["turnActive"] is True
    busy = client.post(f"/v1/sessions/{session_id}/messages", json={"message": "again"})
    assert "a turn is already running" in _problem(busy, 409, "conflict")["detail"]
    events = wait_session_event(client, session_id, "turn.ended")
    assert _types(events).count("turn.started") == 1
    assert client.post(f"/v1/sessions/{session_id}/messages", json={"message": "now"}).status_code == 204
    wait_session_event(client, session_id, "turn.ended", count=2)


def test_terminate_resolves_what_is_pending_stops_the_agent_and_refuses_more(
    client: httpx.Client, tmp_path: Path
) -> None:
    marker = f"never-{uuid.uuid4().hex}"
    session_id = _create(client, tmp_path, env={"TEST_MARKER": marker})
    client.post(f"/v1/sessions/{session_id}/messages", json={"message": f"$ touch {marker}"})
    wait_session_event(client, session_id, "permission.requested")
    native = client.get(f"/v1/sessions/{session_id}").json()["nativeSessionId"]
    assert processes_with(marker, "environ")  # the agent, given the session's env
    assert client.post(f"/v1/sessions/{session_id}/terminate").status_code == 204
    assert client.post(f"/v1/sessions/{session_id}/terminate").status_code == 204  # idempotent
    events = session_events(client, session_id)
    assert _types(events)[-1] == "session.ended"
    resolved = next(event["data"] for event in events if event["type"] == "permission.resolved")
    assert resolved["metadata"]["resolved_by"] in ("cancelled", "agent_exited", "turn_ended")
    assert resolved["status"] == "reject"
    info = client.get(f"/v1/sessions/{session_id}").json()
    assert info["ended"] is True
    assert info["nativeSessionId"] == native
    later = client.post(f"/v1/sessions/{session_id}/messages", json={"message": "hello?"})
    assert "terminated" in _problem(later, 400, "invalid_request")["detail"]
    assert not (tmp_path / marker).exists()
    assert not processes_with(marker, "environ")
    assert all(server["serverId"] != f"session-{session_id}" for server in client.get("/v1/acp").json()["servers"])
    assert len(session_events(client, session_id)) == len(events)  # nothing is logged after session.ended


def test_events_page_by_offset_and_the_stream_starts_at_any_offset(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _create(client, tmp_path)
    client.post(f"/v1/sessions/{session_id}/messages", json={"message": " ".join(f"w{n}" for n in range(30))})
    everything = wait_session_event(client, session_id, "turn.ended")
    first = client.get(f"/v1/sessions/{session_id}/events", params={"offset": 0, "limit": 5}).json()
    assert [e["sequence"] for e in first["events"]] == [1, 2, 3, 4, 5]
    assert first["hasMore"] is True
    rest = client.get(f"/v1/sessions/{session_id}/events", params={"offset": 5, "limit": 10_000}).json()
    assert [e["sequence"] for e in rest["events"]] == list(range(6, len(everything) + 1))
    assert rest["hasMore"] is False
    assert first["events"] + rest["events"] == everything
    frames = read_sse(
        client, "GET", f"/v1/sessions/{session_id}/events/sse?offset=3", until=lambda f: f.data["type"] == "turn.ended"
    )
    assert [f.id for f in frames] == list(range(4, len(everything) + 1))
    assert [f.data for f in frames] == everything[3:]

    def second_turn() -> None:
        time.sleep(0.5)
        client.post(f"/v1/sessions/{session_id}/messages", json={"message": "live"})

    threading.Thread(target=second_turn).start()
    offset = len(everything)
    live = read_sse(
        client,
        "GET",
        f"/v1/sessions/{session_id}/events/sse?offset={offset}",
        until=lambda f: f.data["type"] == "turn.ended",
    )
    assert live[0].id == offset + 1
    assert live[0].data["type"] == "turn.started"
    for query in ({"offset": "-1"}, {"limit": "0"}, {"limit": "10001"}, {"include_raw": "true"}):
        _problem(client.get(f"/v1/sessions/{session_id}/events", params=query), 400, "invalid_request")
    _problem(client.get("/v1/sessions/nosuch/events"), 404, "session_not_found")


def test_message_stream_answers_with_the_turnssession_events(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _create(client, tmp_path)
    before = len(session_events(client, session_id))
    frames = read_sse(
        client,
        "POST",
        f"/v1/sessions/{session_id}/messages/stream",
        until=lambda f: f.data["type"] == "turn.ended",
        json={"message": "stream me"},
    )
    assert frames[0].id == before + 1
    assert frames[0].data["type"] == "turn.started"
    assert "item.delta" in [f.data["type"] for f in frames]


def test_sessions_are_refused_in_upstreams_shapes_and_listed_newest_first(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _create(client, tmp_path, title="first")
    newer = _create(client, tmp_path)
    _problem(client.post(f"/v1/sessions/{session_id}", json={"agent": "mock"}), 409, "session_already_exists")
    _problem(client.post("/v1/sessions/bad%20id", json={"agent": "mock"}), 400, "invalid_request")
    _problem(client.post("/v1/sessions/x-unknown", json={"agent": "nosuch"}), 400, "unsupported_agent")
    _problem(client.post("/v1/sessions/x-not-installed", json={"agent": "claude"}), 400, "agent_not_installed")
    _problem(client.post("/v1/sessions/x-field", json={"agent": "mock", "colour": "blue"}), 400, "invalid_request")
    refused = client.post("/v1/sessions/x-mode", json={"agent": "mock", "agentMode": "yolo"})
    assert "unknown mode 'yolo'" in _problem(refused, 400, "invalid_request")["detail"]
    assert client.get("/v1/sessions/x-mode").status_code == 404  # nothing kept of a refused create
    for unhonoured in ({"variant": "fast"}, {"agentVersion": "1.2.3"}):
        refused = client.post("/v1/sessions/x-unhonoured", json={"agent": "mock", **unhonoured})
        assert "not supported" in _problem(refused, 400, "invalid_request")["detail"]
    listed = [s["sessionId"] for s in client.get("/v1/sessions").json()["sessions"]]
    assert listed.index(newer) < listed.index(session_id)
    question = client.post(f"/v1/sessions/{session_id}/questions/q1/reply", json={"answers": [["a"]]})
    _problem(question, 400, "invalid_request")


def test_the_agents_death_mid_turn_is_an_error_and_the_next_message_starts_it_again(
    client: httpx.Client, tmp_path: Path
) -> None:
    session_id = _create(client, tmp_path, permissionMode="bypass")
    first_native = client.get(f"/v1/sessions/{session_id}").json()["nativeSessionId"]
    client.post(f"/v1/sessions/{session_id}/messages", json={"message": "$ kill -9 $PPID"})
    events = wait_session_event(client, session_id, "turn.ended")
    assert events[-1]["data"]["phase"] == "failed"
    error = next(event["data"] for event in events if event["type"] == "error")
    assert error["code"] == "agent_process_exited"
    assert client.post(f"/v1/sessions/{session_id}/messages", json={"message": "still there?"}).status_code == 204
    events = wait_session_event(client, session_id, "turn.ended", count=2)
    assert events[-1]["data"]["phase"] == "completed"
    restarted = [item for item in _kinds(events, "status") if item["content"][0]["label"] == "agent_restarted"]
    assert restarted[0]["content"][0]["detail"]["previous_native_session_id"] == first_native
    assert client.get(f"/v1/sessions/{session_id}").json()["nativeSessionId"] != first_native


def test_a_second_executor_on_the_same_state_serves_the_same_log_and_goes_on_from_it(tmp_path: Path) -> None:
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    with run_agent_server(state) as first, first.client() as client:
        session_id = _create(client, work, env={"SECRET_TOKEN": "s3cr3t-value"})
        client.post(f"/v1/sessions/{session_id}/messages", json={"message": "remember me"})
        before = wait_session_event(client, session_id, "turn.ended")
        client.post(f"/v1/sessions/{session_id}/messages", json={"message": "$ sleep 30"})
        wait_session_event(client, session_id, "permission.requested")
    session_dir = state / "sessions" / session_id
    assert os.stat(session_dir / "env.json").st_mode & 0o777 == 0o600
    assert b"s3cr3t-value" not in (session_dir / "events.jsonl").read_bytes()
    assert b"s3cr3t-value" not in (session_dir / "session.json").read_bytes()
    with run_agent_server(state) as second, second.client() as client:
        after = session_events(client, session_id)
        assert after[: len(before)] == before
        stopped = after[len(before) :]
        assert {"code": "interrupted", "message": "the agent server stopped during this turn"} in [
            event["data"] for event in stopped if event["type"] == "error"
        ]
        assert _types(stopped)[-1] == "turn.ended"
        assert after[-1]["data"]["phase"] == "interrupted"
        assert (
            client.post(
                f"/v1/sessions/{session_id}/messages", json={"message": "$ echo $SECRET_TOKEN > seen.txt"}
            ).status_code
            == 204
        )
        wait_session_event(client, session_id, "permission.requested", count=2)
        asked = [e for e in session_events(client, session_id) if e["type"] == "permission.requested"]
        assert [e["data"]["permission_id"] for e in asked] == ["perm_1", "perm_2"]
        client.post(f"/v1/sessions/{session_id}/permissions/perm_2/reply", json={"reply": "once"})
        final = wait_session_event(client, session_id, "turn.ended", count=3)
        assert [e["sequence"] for e in final] == list(range(1, len(final) + 1))
        item_ids = [int(e["data"]["item"]["item_id"][4:]) for e in final if e["type"] == "item.started"]
        assert len(item_ids) == len(set(item_ids))  # numbering went on after the first executor's
    assert (work / "seen.txt").read_text() == "s3cr3t-value\n"


def test_after_the_executor_is_killed_a_new_one_serves_the_log_and_marks_the_cut_turn(tmp_path: Path) -> None:
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    with run_agent_server(state) as first, first.client() as client:
        session_id = _create(client, work)
        client.post(f"/v1/sessions/{session_id}/messages", json={"message": "$ sleep 30"})
        before = wait_session_event(client, session_id, "permission.requested")
        port = first.url.rsplit(":", 1)[1]
        (executor,) = [pid for pid in processes_with(f"--agent-port\0{port}\0")]
        os.kill(executor, signal.SIGKILL)
        wait_for(lambda: not processes_with(f"--agent-port\0{port}\0"), what="the executor to die")
    with run_agent_server(state) as second, second.client() as client:
        after = session_events(client, session_id)
        assert after[: len(before)] == before  # the same events at the same offsets
        cut = after[len(before) :]
        assert [event["type"] for event in cut] == ["error", "turn.ended"]
        assert cut[0]["data"] == {"message": "the agent server restarted during this turn", "code": "interrupted"}
        assert cut[1]["data"] == {"phase": "interrupted"}
        assert client.post(f"/v1/sessions/{session_id}/messages", json={"message": "again"}).status_code == 204
        events = wait_session_event(client, session_id, "turn.ended", count=2)
        assert events[-1]["data"]["phase"] == "completed"
        assert [event["sequence"] for event in events] == list(range(1, len(events) + 1))


def test_numbers_that_are_not_plain_decimals_are_a_400_not_a_500(client: httpx.Client, tmp_path: Path) -> None:
    session_id = _create(client, tmp_path)
    for offset in ("²", "1" * 5000, "-1", "1.5"):
        _problem(client.get(f"/v1/sessions/{session_id}/events", params={"offset": offset}), 400, "invalid_request")


def test_messages_racing_a_terminate_start_no_agent_that_outlives_the_session(
    agents: AgentServer, tmp_path: Path
) -> None:
    """Messages sent while a terminate waits for the running turn to end: none may start a new agent."""
    marker = f"race-{uuid.uuid4().hex}"
    with agents.client() as client:
        session_id = _create(client, tmp_path, env={"TEST_MARKER": marker}, permissionMode="bypass")
        client.post(f"/v1/sessions/{session_id}/messages", json={"message": "$ sleep 5"})
        terminated = threading.Event()
        statuses: list[int] = []

        def send() -> None:
            with agents.client() as other:
                while not terminated.is_set():
                    statuses.append(
                        other.post(f"/v1/sessions/{session_id}/messages", json={"message": "hi"}).status_code
                    )

        sender = threading.Thread(target=send)
        sender.start()
        assert client.post(f"/v1/sessions/{session_id}/terminate").status_code == 204
        terminated.set()
        sender.join(30)
        assert set(statuses) <= {400, 409}  # a turn runs, then the session is ending: never accepted
        wait_for(lambda: not processes_with(marker, "environ"), what="no agent of the terminated session")
        assert all(server["serverId"] != f"session-{session_id}" for server in client.get("/v1/acp").json()["servers"])


def test_a_relative_directory_is_the_same_for_the_agent_and_its_tools(agents: AgentServer) -> None:
    assert agents.home is not None
    (agents.home / "proj").mkdir(exist_ok=True)
    with agents.client() as client:
        session_id = f"s-{uuid.uuid4().hex[:10]}"
        created = client.post(
            f"/v1/sessions/{session_id}", json={"agent": "mock", "directory": "proj", "permissionMode": "bypass"}
        )
        assert created.status_code == 200, created.text
        client.post(f"/v1/sessions/{session_id}/messages", json={"message": "$ pwd"})
        events = wait_session_event(client, session_id, "turn.ended")
    (result,) = _kinds(events, "tool_result")
    assert result["status"] == "completed"
    assert result["content"][0]["output"] == f"{agents.home / 'proj'}\n"


class _SlowHub:
    """An AcpHub stand-in whose close waits until told: a terminate stays in progress meanwhile."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.opened = 0

    async def close(self, server_id: str) -> bool:
        await self.release.wait()
        return False

    def open(self, *args: object, **kwargs: object) -> None:
        self.opened += 1
        raise AssertionError("a terminating session opened an agent")


def test_a_message_while_terminate_is_under_way_is_refused_and_opens_no_agent(tmp_path: Path) -> None:
    async def scenario() -> None:
        hub = _SlowHub()
        record = SessionRecord("s-1", "2026-12-02T00:00:00Z", CreateSessionRequest(agent="mock"))
        session = Session(hub, str(tmp_path), record, {})  # type: ignore[arg-type]
        ending = asyncio.get_running_loop().create_task(session.terminate())
        await asyncio.sleep(0)  # terminate has begun: it waits in hub.close
        with pytest.raises(SessionTerminated):
            await session.send("hi")
        hub.release.set()
        await ending
        assert hub.opened == 0
        assert session.record.ended

    asyncio.run(scenario())
