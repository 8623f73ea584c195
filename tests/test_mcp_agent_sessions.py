"""MCP's coding-agent tools with the official MCP client against `agent-sandbox serve` and real sandboxes: an
orchestrating agent starts a session of the built-in mock agent in a sandbox, delegates a command to it, reads its
events from offsets (waiting while the turn runs), answers its permission request, and finds the file the agent's
tool call made, read back through the E2B SDK.

The mock runs each prompt line `$ <command>` as a tool call, after a permission request unless its mode is bypass.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from mcp_types import CallToolResult, TextContent

from activator._mcp._agent_sessions import MAX_EVENTS_BYTES
from activator._mcp._transcript import render
from tests.polling import wait_for_async
from tests.server_fixtures import RunningServer
from tests.test_mcp_server import AGENT_SESSION_TOOLS, call, connect, create, failed, ok

pytestmark = pytest.mark.anyio

WAIT = 120  # seconds a read may wait for the mock's turn: generous, so that a loaded machine cannot fail it
VALID: dict[str, dict[str, Any]] = {  # arguments besides sandboxId that pass the schemas
    "createAgentSession": {},
    "promptAgentSession": {"sessionId": "s", "message": "m"},
    "getAgentSessionEvents": {"sessionId": "s"},
    "replyAgentPermission": {"sessionId": "s", "permissionId": "p", "reply": "once"},
    "listAgentSessions": {},
    "terminateAgentSession": {"sessionId": "s"},
}


@pytest.fixture(scope="module")
async def sandbox_id(server: RunningServer) -> AsyncIterator[str]:
    created = await create(server, metadata={"suite": "mcp-agent-sessions"})
    yield created["sandboxId"]
    await call(server, "deleteSandbox", {"sandboxId": created["sandboxId"]})


def transcript(result: CallToolResult) -> tuple[dict[str, Any], str]:
    """The structured content and the text (a transcript, not the JSON) of a successful getAgentSessionEvents."""
    assert isinstance(result.content[0], TextContent)
    text = result.content[0].text
    assert not result.is_error, text
    structured: dict[str, Any] = result.structured_content
    return structured, text


class Reader:
    """Reads a session's events through getAgentSessionEvents from where the last read ended, as a model would."""

    def __init__(self, server: RunningServer, sandbox_id: str, session_id: str, offset: int = 0) -> None:
        self.server, self.sandbox_id, self.session_id, self.offset = server, sandbox_id, session_id, offset
        self.events: list[dict[str, Any]] = []
        self.texts: list[str] = []
        self.last: dict[str, Any] = {}

    async def read(self, **arguments: Any) -> dict[str, Any]:
        result = await call(
            self.server,
            "getAgentSessionEvents",
            {"sandboxId": self.sandbox_id, "sessionId": self.session_id, "offset": self.offset, **arguments},
        )
        structured, text = transcript(result)
        assert [event["sequence"] for event in structured["events"]] == list(
            range(self.offset + 1, structured["nextOffset"] + 1)
        )  # contiguous, and nextOffset is just after them
        self.offset = structured["nextOffset"]
        self.events += structured["events"]
        self.texts.append(text)
        self.last = structured
        return structured

    async def until(self, kind: str, **arguments: Any) -> dict[str, Any]:
        """Read until an event of type `kind` arrived; that event."""

        async def arrived() -> dict[str, Any] | None:
            page = await self.read(**arguments)
            return next((event for event in page["events"] if event["type"] == kind), None)

        return await wait_for_async(arrived, what=f"a {kind} event of session {self.session_id}")

    @property
    def text(self) -> str:
        return "\n".join(self.texts)


async def start(server: RunningServer, sandbox_id: str, session_id: str, **arguments: Any) -> dict[str, Any]:
    return ok(await call(server, "createAgentSession", {"sandboxId": sandbox_id, "sessionId": session_id, **arguments}))


async def prompt(server: RunningServer, sandbox_id: str, session_id: str, message: str) -> dict[str, Any]:
    arguments = {"sandboxId": sandbox_id, "sessionId": session_id, "message": message}
    return ok(await call(server, "promptAgentSession", arguments))


async def in_sandbox(sandbox_id: str, use: Callable[[Sandbox], Any]) -> Any:
    """`use(sandbox)` with the E2B SDK (environment set by `e2b_env`), off the event loop."""
    return await asyncio.to_thread(lambda: use(Sandbox.connect(sandbox_id)))


def tool_results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items = [event["data"]["item"] for event in events if event["type"] == "item.completed"]
    return [item for item in items if item["kind"] == "tool_result"]


async def test_the_tools_are_listed_with_their_schemas(server: RunningServer) -> None:
    async with connect(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools if tool.name in AGENT_SESSION_TOOLS}
    assert list(tools) == AGENT_SESSION_TOOLS
    required = {name: tool.input_schema.get("required") for name, tool in tools.items()}
    assert required == {
        "createAgentSession": ["sandboxId"],
        "promptAgentSession": ["sandboxId", "sessionId", "message"],
        "getAgentSessionEvents": ["sandboxId", "sessionId"],
        "replyAgentPermission": ["sandboxId", "sessionId", "permissionId", "reply"],
        "listAgentSessions": ["sandboxId"],
        "terminateAgentSession": ["sandboxId", "sessionId"],
    }
    reply = tools["replyAgentPermission"].input_schema["properties"]["reply"]
    assert sorted(reply["enum"]) == ["always", "once", "reject"]
    assert tools["createAgentSession"].input_schema["properties"]["agent"]["default"] == "mock"
    assert tools["getAgentSessionEvents"].annotations is not None
    assert tools["getAgentSessionEvents"].annotations.read_only_hint is True


async def test_a_delegated_command_runs_once_its_permission_is_granted(
    server: RunningServer, sandbox_id: str, e2b_env: RunningServer
) -> None:
    created = await start(server, sandbox_id, "delegate")
    assert created["sessionId"] == "delegate"
    assert created["agent"] == "mock"
    assert created["nativeSessionId"]
    sent = await prompt(server, sandbox_id, "delegate", "$ echo hi > /tmp/x.txt")
    assert sent["accepted"] is True
    reader = Reader(server, sandbox_id, "delegate", sent["offset"])

    # one call is enough: it waits while the turn runs until the agent asks (the bound only limits a failure)
    first = await reader.read(waitSeconds=WAIT)
    [asked] = [event for event in first["events"] if event["type"] == "permission.requested"]
    permission_id = asked["data"]["permission_id"]
    assert permission_id == "perm_1"
    assert reader.last["pendingPermissions"] == [permission_id]
    assert reader.last["turnActive"] is True
    assert f"PERMISSION REQUESTED {permission_id}: Run `echo hi > /tmp/x.txt`" in reader.texts[-1]
    assert reader.texts[-1].endswith(f"the agent waits for replyAgentPermission on {permission_id}")
    assert "user: $ echo hi > /tmp/x.txt" in reader.text
    assert not await in_sandbox(sandbox_id, lambda sbx: sbx.files.exists("/tmp/x.txt"))  # nothing ran yet
    idle = await reader.read(waitSeconds=1)  # nothing comes while the agent waits: the wait ends empty-handed
    assert (idle["events"], idle["nextOffset"], idle["turnActive"]) == ([], first["nextOffset"], True)
    assert reader.texts[-1].startswith(f"(no events after offset {first['nextOffset']})\n--\n")

    busy = await call(server, "promptAgentSession", {"sandboxId": sandbox_id, "sessionId": "delegate", "message": "x"})
    assert "a turn is already running in this session" in failed(busy)

    replied = ok(
        await call(
            server,
            "replyAgentPermission",
            {"sandboxId": sandbox_id, "sessionId": "delegate", "permissionId": permission_id, "reply": "once"},
        )
    )
    assert replied == {"sandboxId": sandbox_id, "sessionId": "delegate", "permissionId": permission_id, "reply": "once"}
    done = await reader.read(waitSeconds=WAIT)  # again one call, until the turn ended
    assert done["events"][-1]["type"] == "turn.ended"
    assert done["events"][-1]["data"]["phase"] == "completed"
    assert (done["turnActive"], done["hasMore"]) == (False, False)

    types = [event["type"] for event in reader.events]
    assert types.index("permission.requested") < types.index("permission.resolved") < types.index("turn.ended")
    resolved = next(event for event in reader.events if event["type"] == "permission.resolved")
    assert resolved["data"]["metadata"] == {"reply": "once", "option_id": "allow", "resolved_by": "client"}
    assert [(item["status"], item["content"][0]["output"]) for item in tool_results(reader.events)] == [
        ("completed", "")
    ]
    assert f"permission {permission_id} accept (once by client)" in reader.text
    assert "tool result of itm_" in reader.text
    assert "agent: Ran 1 command(s)." in reader.text
    assert "turn ended: completed (end_turn)" in reader.text
    assert reader.texts[-1].endswith("no turn is running: send the next message with promptAgentSession")
    assert "item.delta" not in reader.text  # deltas are folded into their message

    assert await in_sandbox(sandbox_id, lambda sbx: sbx.files.read("/tmp/x.txt")) == "hi\n"

    # the whole log again from 0: the same events, with the same offsets
    again, _ = transcript(
        await call(
            server,
            "getAgentSessionEvents",
            {"sandboxId": sandbox_id, "sessionId": "delegate", "offset": 0, "waitSeconds": 0},
        )
    )
    assert again["events"][sent["offset"] :] == reader.events


async def test_a_rejected_command_does_not_run(server: RunningServer, sandbox_id: str, e2b_env: RunningServer) -> None:
    await start(server, sandbox_id, "refused")
    sent = await prompt(server, sandbox_id, "refused", "$ echo no > /tmp/refused.txt")
    reader = Reader(server, sandbox_id, "refused", sent["offset"])
    asked = await reader.until("permission.requested")
    arguments = {"sandboxId": sandbox_id, "sessionId": "refused", "permissionId": asked["data"]["permission_id"]}
    ok(await call(server, "replyAgentPermission", arguments | {"reply": "reject"}))
    await reader.until("turn.ended")
    [result] = tool_results(reader.events)
    assert (result["status"], result["content"][0]["output"]) == ("failed", "User refused permission to run tool")
    assert "[failed]: User refused permission to run tool" in reader.text
    assert not await in_sandbox(sandbox_id, lambda sbx: sbx.files.exists("/tmp/refused.txt"))

    again = await call(server, "replyAgentPermission", arguments | {"reply": "once"})
    assert f"no pending permission request {asked['data']['permission_id']}" in failed(again)


async def test_a_bypass_session_runs_without_asking_and_long_pages_go_on_at_next_offset(
    server: RunningServer, sandbox_id: str
) -> None:
    await start(server, sandbox_id, "bypass", permissionMode="bypass", directory="/tmp")
    commands = "\n".join("$ head -c 70000 /dev/zero | tr '\\0' a" for _ in range(5))  # 64 KiB of output each
    sent = await prompt(server, sandbox_id, "bypass", f"{commands}\n$ pwd")
    reader = Reader(server, sandbox_id, "bypass", sent["offset"])
    await reader.until("turn.ended")
    assert "permission.requested" not in [event["type"] for event in reader.events]
    outputs = [item["content"][0]["output"] for item in tool_results(reader.events)]
    assert [len(output) for output in outputs[:5]] == [64 * 1024] * 5  # the mock's own cap
    assert outputs[5] == "/tmp\n"  # in the session's directory
    assert "characters cut: the whole text is in the events" in reader.text

    paged = Reader(server, sandbox_id, "bypass")
    first = await paged.read(waitSeconds=0)
    assert first["hasMore"] is True  # cut by size, not by limit
    assert len(first["events"]) < 200
    assert len(json.dumps(first["events"])) < MAX_EVENTS_BYTES + 70_000
    assert paged.texts[-1].endswith(f"call getAgentSessionEvents again with offset {first['nextOffset']}")
    while paged.last["hasMore"]:
        await paged.read(waitSeconds=0)
    assert paged.events[sent["offset"] :] == reader.events

    few = await Reader(server, sandbox_id, "bypass").read(limit=3, waitSeconds=0)
    assert (len(few["events"]), few["nextOffset"], few["hasMore"]) == (3, 3, True)

    listed = ok(await call(server, "listAgentSessions", {"sandboxId": sandbox_id}))
    session = next(session for session in listed["sessions"] if session["sessionId"] == "bypass")
    assert session["agent"] == "mock"
    assert session["permissionMode"] == "bypass"
    assert session["eventCount"] == paged.offset
    mock = next(agent for agent in listed["agents"] if agent["id"] == "mock")
    assert mock["installed"] is True
    assert {"claude", "codex", "opencode", "pi"} <= {agent["id"] for agent in listed["agents"]}


async def test_a_terminated_session_keeps_its_events(server: RunningServer, sandbox_id: str) -> None:
    created = ok(await call(server, "createAgentSession", {"sandboxId": sandbox_id, "permissionMode": "bypass"}))
    session_id = created["sessionId"]
    assert session_id.startswith("session-")
    sent = await prompt(server, sandbox_id, session_id, "hello there")
    reader = Reader(server, sandbox_id, session_id, sent["offset"])
    await reader.until("turn.ended")
    assert "agent: Mock reply to: hello there" in reader.text
    assert "thinking: Thinking about: hello there" in reader.text
    terminated = ok(await call(server, "terminateAgentSession", {"sandboxId": sandbox_id, "sessionId": session_id}))
    assert terminated == {"sandboxId": sandbox_id, "sessionId": session_id, "terminated": True}
    await reader.until("session.ended")
    assert reader.last["ended"] is True
    assert "session ended: terminated" in reader.text
    assert reader.texts[-1].endswith("the session has ended")
    more = {"sandboxId": sandbox_id, "sessionId": session_id, "message": "more"}
    refused = await call(server, "promptAgentSession", more)
    assert "session terminated" in failed(refused)


async def test_a_paused_sandbox_is_woken_to_go_on_with_its_session(server: RunningServer) -> None:
    sandbox_id = (await create(server))["sandboxId"]
    try:
        await start(server, sandbox_id, "kept", permissionMode="bypass")
        sent = await prompt(server, sandbox_id, "kept", "$ echo kept > kept.txt")
        reader = Reader(server, sandbox_id, "kept", sent["offset"])
        await reader.until("turn.ended")
        paused = httpx.post(f"{server.url}/sandboxes/{sandbox_id}/pause", headers={"X-API-Key": server.api_key})
        assert paused.status_code == 204, paused.text
        assert ok(await call(server, "getSandbox", {"sandboxId": sandbox_id}))["state"] == "paused"

        woken = Reader(server, sandbox_id, "kept")
        await woken.read(waitSeconds=0)
        assert woken.events[sent["offset"] :] == reader.events  # the log on the sandbox's disk, same offsets
        assert ok(await call(server, "getSandbox", {"sandboxId": sandbox_id}))["state"] == "running"
        again = await prompt(server, sandbox_id, "kept", "$ cat kept.txt")
        after = Reader(server, sandbox_id, "kept", again["offset"])
        await after.until("turn.ended")
        assert [item["content"][0]["output"] for item in tool_results(after.events)] == ["kept\n"]
    finally:
        await call(server, "deleteSandbox", {"sandboxId": sandbox_id})


async def test_a_session_id_that_is_taken_is_refused(server: RunningServer, sandbox_id: str) -> None:
    await start(server, sandbox_id, "twice")
    again = await call(server, "createAgentSession", {"sandboxId": sandbox_id, "sessionId": "twice"})
    assert "session already exists: twice" in failed(again)
    assert "create a session with another sessionId" in failed(again)


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        (
            "promptAgentSession",
            {"sessionId": "nosuch", "message": "hi"},
            "session not found: nosuch. listAgentSessions",
        ),
        ("getAgentSessionEvents", {"sessionId": "nosuch"}, "session not found: nosuch"),
        ("terminateAgentSession", {"sessionId": "nosuch"}, "session not found: nosuch"),
        ("createAgentSession", {"agent": "nosuchagent"}, "unsupported agent: nosuchagent. listAgentSessions lists"),
        ("createAgentSession", {"agentMode": "sideways"}, "the mock agent refused: "),
        (
            "createAgentSession",
            {"sessionId": "bad id"},
            "invalid arguments for createAgentSession: Expected `str` matching regex",
        ),
        ("createAgentSession", {"permissionTimeoutMs": 5}, "Expected `int` >= 1000 - at `$.permissionTimeoutMs`"),
        ("createAgentSession", {"env": {"A=B": "c"}}, "invalid arguments for createAgentSession"),
        ("promptAgentSession", {"sessionId": "x", "message": ""}, "Expected `str` of length >= 1 - at `$.message`"),
        ("getAgentSessionEvents", {"sessionId": "x", "limit": 0}, "Expected `int` >= 1 - at `$.limit`"),
        (
            "getAgentSessionEvents",
            {"sessionId": "x", "waitSeconds": 3600},
            "Expected `float` <= 300.0 - at `$.waitSeconds`",
        ),
        ("getAgentSessionEvents", {"sessionId": "x", "from": 3}, "Object contains unknown field `from`"),
        ("replyAgentPermission", {"sessionId": "x", "permissionId": "p", "reply": "maybe"}, "at `$.reply`"),
        ("replyAgentPermission", {"sessionId": "x", "permissionId": "p"}, "missing required field `reply`"),
    ],
)
async def test_bad_calls_are_tool_errors_that_say_why(
    server: RunningServer, sandbox_id: str, tool: str, arguments: dict[str, Any], message: str
) -> None:
    assert message in failed(await call(server, tool, {"sandboxId": sandbox_id, **arguments}))


@pytest.mark.parametrize("tool", AGENT_SESSION_TOOLS)
async def test_an_unknown_sandbox_is_a_tool_error(server: RunningServer, tool: str) -> None:
    arguments = {"sandboxId": "nosuchsandbox", **VALID[tool]}
    assert "doesn't exist or you don't have access to it" in failed(await call(server, tool, arguments))


def test_a_message_still_streaming_is_shown_as_far_as_it_got() -> None:
    def event(sequence: int, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        return {"sequence": sequence, "type": kind, "data": data}

    item = {"item_id": "itm_2", "kind": "message", "role": "assistant", "content": [{"type": "text", "text": ""}]}
    page = [
        event(7, "item.started", {"item": item}),
        event(8, "item.delta", {"item_id": "itm_2", "delta": "Hello "}),
        event(9, "item.delta", {"item_id": "itm_2", "delta": "wor"}),
        event(10, "question.requested", {"question_id": "q1"}),
    ]
    assert render(page, next_offset=10, footer="end") == (
        '#7 agent (in progress): Hello wor\n#10 question.requested: {"question_id":"q1"}\n--\nend'
    )
    assert render([], next_offset=4, footer="end") == "(no events after offset 4)\n--\nend"
