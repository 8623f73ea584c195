"""ACP → universal events, pinned on the recorded ACP streams of the real agents (coding-agents.md §14)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from executor._agents._normalise import Normaliser

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "coding-agents"
RECORDINGS = ["claude", "claude-reject", "codex", "codex-ro", "opencode", "pi"]


def _updates(name: str) -> list[dict[str, Any]]:
    messages = [
        json.loads(line[5:])
        for line in (FIXTURES / f"acp-{name}.sse").read_text().splitlines()
        if line.startswith("data:")
    ]
    return [m["params"]["update"] for m in messages if m.get("method") == "session/update"]


def _normalise(name: str) -> list[tuple[str, dict[str, Any]]]:
    normaliser = Normaliser()
    events = normaliser.user_message("Create hello.txt please")
    for update in _updates(name):
        events += normaliser.update(update)
    return events + normaliser.close_open()


@pytest.mark.parametrize("name", RECORDINGS)
def test_every_recorded_agent_stream_maps_to_known_events_with_no_unparsed(name: str) -> None:
    kinds = {kind for kind, _ in _normalise(name)}
    assert kinds <= {"item.started", "item.delta", "item.completed"}, kinds


@pytest.mark.parametrize("name", ["claude", "codex", "codex-ro", "opencode", "pi"])
def test_a_tool_call_that_ran_ends_with_its_result_holding_the_commands_output(name: str) -> None:
    events = _normalise(name)
    started = [data["item"] for kind, data in events if kind == "item.started" and data["item"]["kind"] == "tool_call"]
    results = [
        data["item"] for kind, data in events if kind == "item.completed" and data["item"]["kind"] == "tool_result"
    ]
    assert len(started) >= 1
    assert results, "no tool_result item"
    assert any("hello from scripted model" in item["content"][0]["output"] for item in results)
    assert results[-1]["parent_id"] in {item["item_id"] for item in started}


def test_a_rejected_tool_call_fails_and_its_result_says_why() -> None:
    events = _normalise("claude-reject")
    results = [
        data["item"] for kind, data in events if kind == "item.completed" and data["item"]["kind"] == "tool_result"
    ]
    assert results[-1]["status"] == "failed"


@pytest.mark.parametrize("name", RECORDINGS)
def test_message_deltas_add_up_to_the_completed_message(name: str) -> None:
    events = _normalise(name)
    deltas: dict[str, str] = {}
    for kind, data in events:
        if kind == "item.delta":
            deltas[data["item_id"]] = deltas.get(data["item_id"], "") + data["delta"]
    completed = {
        data["item"]["item_id"]: data["item"]["content"][0]["text"]
        for kind, data in events
        if kind == "item.completed" and data["item"]["item_id"] in deltas
    }
    assert deltas
    assert completed == deltas
    assert any("DONE" in text or "hello" in text for text in completed.values())


def test_an_item_is_started_before_its_deltas_and_completed_once() -> None:
    events = _normalise("codex")
    seen: dict[str, list[str]] = {}
    for kind, data in events:
        item_id = data["item_id"] if kind == "item.delta" else data["item"]["item_id"]
        seen.setdefault(item_id, []).append(kind)
    for item_id, kinds in seen.items():
        assert kinds[0] == "item.started" or kinds == ["item.completed"], (item_id, kinds)
        assert kinds.count("item.completed") == 1, (item_id, kinds)


def test_status_updates_become_status_items_and_unknown_updates_are_unparsed_not_dropped() -> None:
    normaliser = Normaliser()
    [(kind, data)] = normaliser.update({"sessionUpdate": "usage_update", "used": 43, "size": 200000})
    assert kind == "item.completed"
    assert data["item"]["content"] == [
        {"type": "status", "label": "usage_update", "detail": {"used": 43, "size": 200000}}
    ]
    [(kind, data)] = normaliser.update({"sessionUpdate": "something_new"})
    assert kind == "agent.unparsed"


def test_text_outside_a_turn_is_a_message_completed_at_once_not_one_the_turn_continues() -> None:
    normaliser = Normaliser()
    banner = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "pi v1.6.0\n---\n"}}
    before = normaliser.update(banner)  # Pi's start-up banner, sent after session/new
    assert [kind for kind, _ in before] == ["item.started", "item.delta", "item.completed"]
    assert before[-1][1]["item"]["content"][0]["text"] == "pi v1.6.0\n---\n"
    normaliser.user_message("Create hello.txt please")
    reply = normaliser.update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "DONE."}})
    assert [kind for kind, _ in reply] == ["item.started", "item.delta"]
    (_, done), *_ = normaliser.close_open()
    assert done["item"]["content"][0]["text"] == "DONE."
    assert done["item"]["item_id"] != before[0][1]["item"]["item_id"]


def test_a_tool_calls_title_follows_its_updates() -> None:
    normaliser = Normaliser()
    normaliser.user_message("Create hello.txt please")
    normaliser.update({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "bash", "kind": "execute"})
    command = "printf 'hello' > hello.txt"
    normaliser.update({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "title": command, "rawInput": {}})
    [(_, called), *_] = normaliser.update(
        {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed", "rawOutput": {"output": "x"}}
    )
    assert (called["item"]["kind"], called["item"]["title"]) == ("tool_call", command)


def test_a_chunk_whose_text_is_not_a_string_adds_nothing_and_raises_nothing() -> None:
    normaliser = Normaliser()
    normaliser.user_message("hi")
    odd = normaliser.update({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": None}})
    assert [kind for kind, _ in odd] == ["item.started", "item.delta"]
    assert odd[1][1]["delta"] == ""
