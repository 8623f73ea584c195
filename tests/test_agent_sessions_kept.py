"""Sessions outlive their sandbox: the control plane's copy of a sandbox's coding-agent sessions, against
`agent-sandbox serve` and real sandboxes running the built-in mock agent.

A running sandbox's sessions are copied as they go; a pause copies them whole, and reading the copy does not wake
the sandbox; after `kill` the same events, with the same offsets, are read through the control-plane API
(`/sandboxes/{id}/agent-sessions`, `/agent-sessions`) and MCP's getAgentSessionEvents / listAgentSessions.
Pulling a sandbox's sessions does not count as its traffic (the idle policy still pauses it), and
`--agent-session-retention 0` deletes the copy with the sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.polling import wait_for
from tests.server_fixtures import RunningServer, server_in_temp_dir
from tests.test_mcp_agent_sessions import Reader, prompt, start, transcript
from tests.test_mcp_server import call, create, failed, ok

pytestmark = pytest.mark.anyio


def api(server: RunningServer, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", params=params, headers={"X-API-Key": server.api_key}, timeout=30)


def kept(server: RunningServer, sandbox_id: str) -> dict[str, Any]:
    answer = api(server, f"/sandboxes/{sandbox_id}/agent-sessions")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def kept_events(server: RunningServer, sandbox_id: str, session_id: str, **params: Any) -> dict[str, Any]:
    answer = api(server, f"/sandboxes/{sandbox_id}/agent-sessions/{session_id}/events", **params)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def run_turn(server: RunningServer, sandbox_id: str, session_id: str, message: str) -> list[dict[str, Any]]:
    """Start a bypass session, run one turn; every event of the session so far, read from the sandbox."""
    await start(server, sandbox_id, session_id, permissionMode="bypass")
    await Reader(
        server, sandbox_id, session_id, (await prompt(server, sandbox_id, session_id, message))["offset"]
    ).until("turn.ended")
    reader = Reader(server, sandbox_id, session_id)
    await reader.read(waitSeconds=0, limit=1000)
    return reader.events


def copied(server: RunningServer, sandbox_id: str, session_id: str, events: list[dict[str, Any]]) -> bool | None:
    """Whether the copy holds `events` (None: not yet, or no copy yet)."""
    answer = api(server, f"/sandboxes/{sandbox_id}/agent-sessions/{session_id}/events")
    return (answer.status_code == 200 and answer.json()["events"] == events) or None


def paged(server: RunningServer) -> list[dict[str, Any]]:
    """`GET /agent-sessions` one session a page, following `X-Next-Token`."""
    found: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        answer = api(server, "/agent-sessions", limit=1, **({"nextToken": token} if token else {}))
        assert answer.status_code == 200, answer.text
        found += answer.json()
        token = answer.headers.get("X-Next-Token")
        if token is None:
            return found


def state(server: RunningServer, sandbox_id: str) -> str:
    answer = api(server, f"/sandboxes/{sandbox_id}")
    assert answer.status_code == 200, answer.text
    return str(answer.json()["state"])


async def test_a_killed_sandboxs_sessions_are_read_from_the_control_plane_with_the_same_offsets(
    server: RunningServer,
) -> None:
    sandbox_id = (await create(server, metadata={"suite": "agent-sessions-kept"}))["sandboxId"]
    events = await run_turn(server, sandbox_id, "kept", "$ echo kept")
    assert [event["sequence"] for event in events] == list(range(1, len(events) + 1))
    await run_turn(server, sandbox_id, "kept-too", "$ echo too")
    ok(await call(server, "deleteSandbox", {"sandboxId": sandbox_id}))

    copy = kept(server, sandbox_id)
    assert copy["endedAt"] is not None
    assert copy["truncated"] is False
    too, session = copy["sessions"]  # newest first
    assert (session["sessionId"], session["agent"], session["eventCount"]) == ("kept", "mock", len(events))
    assert session["ended"] is True
    assert session.keys().isdisjoint({"turnActive", "pendingPermissions"})  # false, none: defaults are left out
    assert too["sessionId"] == "kept-too"
    assert kept_events(server, sandbox_id, "kept")["events"] == events
    page = kept_events(server, sandbox_id, "kept", offset=2, limit=2)
    assert page == {"events": events[2:4], "hasMore": True}
    assert kept_events(server, sandbox_id, "kept", offset=len(events)) == {"events": [], "hasMore": False}
    listed = api(server, "/agent-sessions", limit=1000).json()
    assert {"sandboxID": sandbox_id, "templateID": "base", "session": session, "sandboxEndedAt": copy["endedAt"]} in (
        listed
    )
    assert paged(server) == listed  # a page at a time, by X-Next-Token: the same listing

    structured, text = transcript(
        await call(server, "getAgentSessionEvents", {"sandboxId": sandbox_id, "sessionId": "kept", "offset": 1})
    )
    assert structured["events"] == events[1:]
    assert (structured["nextOffset"], structured["killed"], structured["ended"]) == (len(events), True, True)
    assert "the control plane's copy" in text
    listing = ok(await call(server, "listAgentSessions", {"sandboxId": sandbox_id}))
    assert [one["sessionId"] for one in listing["sessions"]] == ["kept-too", "kept"]
    assert listing["killed"] is True
    refused = await call(server, "promptAgentSession", {"sandboxId": sandbox_id, "sessionId": "kept", "message": "m"})
    assert "doesn't exist" in failed(refused)  # a killed sandbox's session is read, never prompted


async def test_a_running_sandboxs_events_are_copied_as_they_come_and_a_paused_one_is_not_woken_to_read_them(
    server: RunningServer,
) -> None:
    sandbox_id = (await create(server))["sandboxId"]
    try:
        events = await run_turn(server, sandbox_id, "live", "$ echo live")
        wait_for(
            lambda: copied(server, sandbox_id, "live", events),
            what="the running sandbox's events in the control plane's copy",
        )
        assert kept(server, sandbox_id)["endedAt"] is None
        more = await prompt(server, sandbox_id, "live", "again")
        await Reader(server, sandbox_id, "live", more["offset"]).until("turn.ended")
        paused = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/pause", headers={"X-API-Key": server.api_key})
        assert paused.status_code == 204, paused.text
        whole = kept_events(server, sandbox_id, "live")["events"]  # whole at the pause: no waiting
        assert whole[: len(events)] == events
        assert whole[-1]["type"] == "turn.ended"
        assert state(server, sandbox_id) == "paused"  # reading the copy did not wake it
    finally:
        await call(server, "deleteSandbox", {"sandboxId": sandbox_id})


async def test_sessions_of_a_sandbox_never_used_by_an_agent_are_not_kept(server: RunningServer) -> None:
    sandbox_id = (await create(server))["sandboxId"]
    await call(server, "deleteSandbox", {"sandboxId": sandbox_id})
    answer = api(server, f"/sandboxes/{sandbox_id}/agent-sessions")
    assert answer.status_code == 404
    assert answer.json() == {"code": 404, "message": f"no sessions are kept of sandbox {sandbox_id}"}
    refused = await call(server, "getAgentSessionEvents", {"sandboxId": sandbox_id, "sessionId": "s"})
    assert "doesn't exist" in failed(refused)
    bad = api(server, f"/sandboxes/{sandbox_id}/agent-sessions/..%2Fx/events")
    assert bad.status_code in (400, 404)
    assert api(server, "/agent-sessions", limit=0).status_code == 400
    forged = api(server, "/agent-sessions", nextToken="nothing-it-gave")
    assert (forged.status_code, forged.json()["code"]) == (400, 400)


@pytest.fixture(scope="module")
def forgetful(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose sandboxes pause after 3 s without traffic and whose copies go with their sandbox."""
    args = ("--pause-after", "3", "--agent-session-retention", "0")
    with server_in_temp_dir(tmp_path_factory, "forgetful", *args) as running:
        yield running


async def test_copying_the_sessions_does_not_keep_a_sandbox_awake_and_no_retention_deletes_them(
    forgetful: RunningServer,
) -> None:
    sandbox_id = (await create(forgetful))["sandboxId"]
    events = await run_turn(forgetful, sandbox_id, "idle", "$ echo idle")
    wait_for(lambda: copied(forgetful, sandbox_id, "idle", events), what="the sandbox's events in the copy")
    # The module's one sandbox: /health's counts say its state. Copying goes on every second, and yet it pauses.
    wait_for(
        lambda: httpx.get(f"{forgetful.url}/health").json()["sandboxes"]["paused"] == 1 or None,
        what="the idle policy's pause of a sandbox whose sessions are copied",
    )
    ok(await call(forgetful, "deleteSandbox", {"sandboxId": sandbox_id}))
    assert api(forgetful, f"/sandboxes/{sandbox_id}/agent-sessions").status_code == 404


def test_a_session_started_inside_a_sandbox_nobody_followed_is_kept_at_its_kill(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create()
    start_inside = (
        "curl -fsS -X POST localhost:2468/v1/sessions/inside -H 'Content-Type: application/json' -H "
        f"""'Authorization: Bearer {sbx._envd_access_token}' -d '{{"agent": "mock"}}'"""
    )  # as an agent inside would, given the sandbox's token
    try:
        assert sbx.commands.run(start_inside).exit_code == 0  # not through the server: no sweep has found it
    finally:
        sbx.kill()
    [session] = kept(e2b_env, sbx.sandbox_id)["sessions"]
    assert (session["sessionId"], session["agent"], session["ended"]) == ("inside", "mock", True)
    assert kept_events(e2b_env, sbx.sandbox_id, "inside")["events"][0]["type"] == "session.started"
