"""Codex, OpenCode and Pi installed from npm and driven through the universal session API, offline.

Each agent is installed once for the module with `POST /v1/agents/{id}/install` (npm, as a user's sandbox
would: 175-354 MB each) into a temporary agents directory, with the test environment's Node.js 24 on the
executor's PATH. Its config, written into the agents' HOME (the executor's `--home`) as a user would put it
in a template, points it at the scripted model server on loopback (coding-agents.md §7.2). Then one
session approves the tool call the model asks for and one refuses it:

- Codex (codex-acp) in its `read-only` mode runs commands in its sandbox; the model's `[[escalate]]`
  request to run outside it is what Codex asks permission for (§9). Approved, the command writes the
  file; refused (Codex's `abort`), Codex ends the turn without running it.
- OpenCode asks before each bash command when its config says `permission: {bash: "ask"}`. Refused,
  the tool call fails with OpenCode's reason and the turn ends (the model is not asked again).
- Pi never asks by itself (it has no permission prompts: every tool runs). It asks only through an
  extension that calls `ctx.ui.confirm`, which pi-acp turns into `session/request_permission`; the test
  installs such an extension in `~/.pi/agent/extensions`, as a user who wants a gate would. Refused,
  the extension blocks the call, and the model gets the reason and answers.

Every approved run checks that the tool really ran (the file is there) and that the events came in the
universal schema and in order: session.started, turn.started, the user's message, the permission asked
and resolved, the tool_call item and its tool_result item with the command's output, the assistant's
deltas of the final text, turn.ended completed.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_configs import SESSION_ENV, TURNS, Turn, write_config
from tests.agent_fixtures import AgentServer, node_bin, run_agent_server, session_events, wait_session_event
from tests.polling import wait_for
from tests.scripted_model import ScriptedModel

pytestmark = pytest.mark.timeout(1200)  # a cold npm install of an agent, then its turns, on a loaded machine

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
TRUST = {name: os.environ[name] for name in ("NODE_EXTRA_CA_CERTS",) if name in os.environ}
"""What a sandbox's user sets where the registry is reached through a TLS-intercepting proxy (as on this machine)."""
OUTPUT = "hello from scripted model"
TURN_SECONDS = 300.0  # an agent's start and one turn against the script, on a loaded 2-core machine
EVENT_TYPES = {
    "session.started", "session.ended", "turn.started", "turn.ended", "item.started", "item.delta",
    "item.completed", "error", "permission.requested", "permission.resolved", "question.requested",
    "question.resolved", "agent.unparsed",
}  # fmt: skip
ITEM_KINDS = {"message", "tool_call", "tool_result", "system", "status", "unknown"}


@dataclass(frozen=True)
class Agent:
    """How one agent is installed, configured and asked to run the scripted command."""

    id: str
    artifacts: tuple[tuple[str, str, str], ...]
    """(command, npm package, version) of each artifact the install reports."""
    wire: str
    """The model API the agent speaks (the scripted model's route)."""

    @property
    def turn(self) -> Turn:
        return TURNS[self.id]


AGENTS = {
    agent.id: agent
    for agent in (
        Agent(
            "codex",
            (("codex-acp", "npm:@zed-industries/codex-acp", "0.16.0"),),
            "/v1/responses",
        ),
        Agent("opencode", (("opencode", "npm:opencode-ai", "1.18.33"),), "/v1/chat/completions"),
        Agent(
            "pi",
            (("pi-acp", "npm:pi-acp", "0.0.34"), ("pi", "npm:@earendil-works/pi-coding-agent", "1.6.0")),
            "/v1/chat/completions",
        ),
    )
}


@dataclass
class Bench:
    """One executor with its agents directory, the scripted model, and the agents installed so far."""

    server: AgentServer
    client: httpx.Client
    model: ScriptedModel
    agents_dir: Path
    path: str
    """The sandbox's PATH (with Node.js), which each session also gives its agent, as a user may."""
    installed: dict[str, float] = field(default_factory=dict)
    """Agent id -> seconds its install took."""
    sessions: int = 0

    def install(self, agent: Agent) -> None:
        """Install the agent (the first time only) and write its config into the agents' HOME."""
        if agent.id in self.installed:
            return
        started = time.monotonic()
        answer = self.client.post(f"/v1/agents/{agent.id}/install", json={})
        assert answer.status_code == 200, answer.text
        assert answer.json()["already_installed"] is False
        self.installed[agent.id] = time.monotonic() - started
        bin_dir = self.agents_dir / agent.id / "bin"
        reported = [(a["path"], a["source"], a["version"]) for a in answer.json()["artifacts"]]
        assert reported == [(str(bin_dir / command), source, version) for command, source, version in agent.artifacts]
        assert self.client.get(f"/v1/agents/{agent.id}").json()["installed"] is True
        files = {(s.st_dev, s.st_ino): s.st_size for p in (self.agents_dir / agent.id).rglob("*") if (s := p.lstat())}
        size = sum(files.values())  # hard links once, as du counts them
        print(f"installed {agent.id}: {self.installed[agent.id]:.0f} s, {size / 2**20:.0f} MiB")  # for the log (-s)
        assert self.server.home is not None
        write_config(self.server.home, agent.id, self.model.url)

    def session(self, agent: Agent, work: Path) -> str:
        """A new session of the agent working in `work`; its id."""
        self.sessions += 1
        session_id = f"{agent.id}-{self.sessions}"
        env = SESSION_ENV | {"PATH": self.path}
        body = {"agent": agent.id, "directory": str(work), "env": env} | agent.turn.session
        created = self.client.post(f"/v1/sessions/{session_id}", json=body)
        assert created.status_code == 200, created.text
        return session_id


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    root = tmp_path_factory.mktemp("real-clis")
    agents_dir = root / "agents"
    path = f"{node_bin(root / 'bin')}:{SYSTEM_PATH}"
    with (
        ScriptedModel() as model,
        run_agent_server(agents_dir=agents_dir, path=path, env_vars=TRUST) as server,
        server.client() as client,
    ):
        client.timeout = httpx.Timeout(900)  # an install from a cold npm cache
        yield Bench(server, client, model, agents_dir, path)
    shutil.rmtree(agents_dir)  # 700 MB; pytest keeps the last runs' temporary directories


def _items(events: list[dict[str, Any]], kind: str, of: str) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) of the `kind` events whose item is of kind `of`."""
    return [
        (index, event["data"]["item"])
        for index, event in enumerate(events)
        if event["type"] == kind and event["data"]["item"]["kind"] == of
    ]


def _assert_universal(events: list[dict[str, Any]], session_id: str) -> None:
    """The envelope and item shapes of the universal schema, and each item's life in order."""
    assert [event["sequence"] for event in events] == list(range(1, len(events) + 1))
    started: dict[str, int] = {}
    completed: dict[str, int] = {}
    for index, event in enumerate(events):
        assert event["event_id"] == f"evt_{event['sequence']}"
        assert event["session_id"] == session_id
        assert event["source"] in ("agent", "daemon")
        assert event["type"] in EVENT_TYPES, event
        assert event["type"] not in ("agent.unparsed", "error"), event
        data = event["data"]
        if event["type"] in ("item.started", "item.completed"):
            item = data["item"]
            assert item["item_id"].startswith("itm_")
            assert item["kind"] in ITEM_KINDS
            assert item["status"] in ("in_progress", "completed", "failed")
            assert isinstance(item["content"], list)
            seen = started if event["type"] == "item.started" else completed
            assert item["item_id"] not in seen, f"{item['item_id']} {event['type']} twice"
            seen[item["item_id"]] = index
        elif event["type"] == "item.delta":
            assert data["item_id"] in started, event
            assert data["item_id"] not in completed, event
    assert set(started) <= set(completed), "an item was started and never completed"
    assert all(started[item] < completed[item] for item in started)


def _assert_one_turn(events: list[dict[str, Any]], phase: str = "completed") -> None:
    """session.started first, then one turn: turn.started, the user's message, ..., turn.ended in `phase`.

    What the agent says while its session is set up (its config and commands as status items, Pi's
    banner as a message) comes between session.started and turn.started. Status items may also follow
    turn.ended (Codex sends its commands after it cancels a turn)."""
    types = [event["type"] for event in events]
    status = [_is_status(event) for event in events]
    start = types.index("session.started")
    assert start == 0, events[:1]
    assert (types.count("turn.started"), types.count("turn.ended")) == (1, 1)
    turn, end = types.index("turn.started"), types.index("turn.ended")
    assert start < turn < end
    assert all(status[end + 1 :]), events[end:]
    assert events[end]["data"]["phase"] == phase, events[end]
    user = events[turn + 1]["data"]["item"]
    assert (user["kind"], user["role"], user["content"][0]["type"]) == ("message", "user", "text")
    lives: dict[str, list[int]] = {}
    for index, event in enumerate(events):
        if event["type"] in ("item.started", "item.completed", "item.delta"):
            item_id = event["data"]["item_id"] if event["type"] == "item.delta" else event["data"]["item"]["item_id"]
            lives.setdefault(item_id, []).append(index)
    for item_id, indexes in lives.items():  # no item outlives its turn, nor starts before it
        sides = {(index > turn) + (index > end) for index in indexes}
        assert len(sides) == 1, (item_id, [events[index] for index in indexes])


def _is_status(event: dict[str, Any]) -> bool:
    return bool(event["type"] == "item.completed" and event["data"]["item"]["kind"] == "status")


def _permission(events: list[dict[str, Any]], status: str) -> tuple[int, int]:
    """The indexes of the one permission asked and its resolution with `status`."""
    asked = [index for index, event in enumerate(events) if event["type"] == "permission.requested"]
    resolved = [index for index, event in enumerate(events) if event["type"] == "permission.resolved"]
    assert (len(asked), len(resolved)) == (1, 1), [events[index] for index in asked + resolved]
    assert events[resolved[0]]["data"]["status"] == status
    assert events[resolved[0]]["data"]["metadata"]["resolved_by"] == "client"
    assert asked[0] < resolved[0]
    return asked[0], resolved[0]


def _run(bench: Bench, agent: Agent, work: Path, reply: str) -> tuple[str, list[dict[str, Any]]]:
    """A session's one turn, its permission request answered with `reply`; the session's id and events."""
    bench.install(agent)
    asked_before = len(bench.model.requests)
    session_id = bench.session(agent, work)
    sent = bench.client.post(f"/v1/sessions/{session_id}/messages", json={"message": agent.turn.prompt})
    assert sent.status_code == 204, sent.text

    def asked_or_ended() -> list[dict[str, Any]] | None:
        events = session_events(bench.client, session_id)
        return events if {"permission.requested", "turn.ended"} & {event["type"] for event in events} else None

    so_far = wait_for(asked_or_ended, what=f"a permission request in session {session_id}", within=TURN_SECONDS)
    requests = [event["data"] for event in so_far if event["type"] == "permission.requested"]
    assert requests, f"the turn ended without asking: {so_far}"
    asked = requests[0]
    answered = bench.client.post(
        f"/v1/sessions/{session_id}/permissions/{asked['permission_id']}/reply", json={"reply": reply}
    )
    assert answered.status_code == 204, answered.text
    events = wait_session_event(bench.client, session_id, "turn.ended", within=TURN_SECONDS)
    paths = {request["path"].partition("?")[0] for request in bench.model.requests[asked_before:]}
    assert agent.wire in paths, paths
    return session_id, events


def _terminate(bench: Bench, session_id: str) -> None:
    assert bench.client.post(f"/v1/sessions/{session_id}/terminate").status_code == 204
    assert session_events(bench.client, session_id)[-1]["type"] == "session.ended"


@pytest.mark.parametrize("agent_id", list(AGENTS))
def test_an_approved_tool_call_runs_and_the_turn_streams_in_the_universal_schema(
    bench: Bench, agent_id: str, tmp_path: Path
) -> None:
    agent = AGENTS[agent_id]
    session_id, events = _run(bench, agent, tmp_path, "once")
    try:
        assert (tmp_path / "hello.txt").read_text() == f"{OUTPUT}\n"
        _assert_universal(events, session_id)
        _assert_one_turn(events)
        asked, resolved = _permission(events, "accept")
        tool_calls = _items(events, "item.started", "tool_call")
        results = _items(events, "item.completed", "tool_result")
        assert tool_calls, events
        ran = [(index, item) for index, item in results if OUTPUT in item["content"][0]["output"]]
        assert ran, results
        result_index, result = ran[-1]
        assert result["status"] == "completed"
        calls = {item["item_id"]: (index, item) for index, item in tool_calls}
        call_index, call = calls[result["parent_id"]]
        assert call["content"][0]["type"] == "tool_call"
        assert call["content"][0]["call_id"] == result["content"][0]["call_id"]
        assert max(call_index, asked, resolved) < result_index
        final = [event for event in events[result_index:] if event["type"] == "item.delta"]
        assert f"DONE. tool output: {OUTPUT}" in "".join(event["data"]["delta"] for event in final)
    finally:
        _terminate(bench, session_id)


@pytest.mark.parametrize("agent_id", list(AGENTS))
def test_a_refused_tool_call_does_not_run_and_the_turn_still_ends(bench: Bench, agent_id: str, tmp_path: Path) -> None:
    agent = AGENTS[agent_id]
    session_id, events = _run(bench, agent, tmp_path, "reject")
    try:
        assert not (tmp_path / "hello.txt").exists()
        _assert_universal(events, session_id)
        _assert_one_turn(events, agent.turn.refused_phase)
        _permission(events, "reject")
        results = [item for _, item in _items(events, "item.completed", "tool_result")]
        assert all(item["status"] == "failed" for item in results), results  # Codex reports none: it aborted
        assert not any(OUTPUT in item["content"][0]["output"] for item in results), results
    finally:
        _terminate(bench, session_id)
