"""ACP messages of one session → universal events (coding-agents.md §4, §5): one schema for every agent.

`Normaliser.update()` takes one `session/update` of the agent and returns the events it means, as
(type, data) pairs; the session numbers and stores them. State per session: the open
assistant message and reasoning items (deltas go to them; a tool call or the turn's end completes
them), the tool calls by ACP id (their result completes them and adds a `tool_result` item), and
whether a turn runs (from `user_message()` to `close_open()`). Text an agent sends outside a turn
(Pi's start-up banner after session/new) is a message item completed at once, so that no item
outlives the turn it was started in, nor starts before its turn.
"""

from __future__ import annotations

import copy
import json
from typing import Any

__all__ = ("Emitted", "Normaliser")

Emitted = tuple[str, dict[str, Any]]
"""(event type, data)."""

_STATUS_UPDATES = frozenset(
    {
        "usage_update",
        "plan",
        "available_commands_update",
        "config_option_update",
        "current_mode_update",
        "session_info_update",
    }
)

_OUTPUT_KEYS = ("output", "formatted_output", "aggregated_output", "stdout", "content")
"""Where agents put a command's text in `rawOutput` (mock, Codex, Claude, others), in order of preference."""


class Normaliser:
    def __init__(self) -> None:
        self._next_item = 0
        self._open: dict[str, dict[str, Any]] = {}  # "message" | "reasoning" -> the open item
        self._tools: dict[str, dict[str, Any]] = {}  # ACP toolCallId -> its tool_call item
        self._terminal: dict[str, str] = {}  # ACP toolCallId -> output streamed in `_meta.terminal_output` (Pi)
        self._in_turn = False

    def item(self, kind: str, role: str | None, content: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """A new item; `itm_<n>` ids count per session."""
        self._next_item += 1
        item = {"item_id": f"itm_{self._next_item}", "native_item_id": None, "parent_id": None, "kind": kind}
        return item | {"role": role, "status": "in_progress", "content": content} | fields

    def resume_numbering(self, items: int) -> None:
        """After a restart: new items continue after the `items` already logged."""
        self._next_item = max(self._next_item, items)

    def user_message(self, text: str) -> list[Emitted]:
        """The turn's prompt: a turn starts."""
        self._in_turn = True
        item = self.item("message", "user", [{"type": "text", "text": text}], status="completed")
        return [("item.started", {"item": item}), ("item.completed", {"item": item})]

    def close_open(self) -> list[Emitted]:
        """The turn's end: complete the open message and reasoning items."""
        self._in_turn = False
        return self._complete_open()

    def _complete_open(self) -> list[Emitted]:
        done = [("item.completed", {"item": item | {"status": "completed"}}) for item in self._open.values()]
        self._open.clear()
        return done

    def update(self, body: dict[str, Any]) -> list[Emitted]:
        """One `session/update`."""
        kind = body.get("sessionUpdate")
        if kind in ("agent_message_chunk", "agent_thought_chunk"):
            return self._chunk("message" if kind == "agent_message_chunk" else "reasoning", body)
        if kind == "tool_call":
            return self._tool_call(body)
        if kind == "tool_call_update":
            return self._tool_update(body)
        if kind == "user_message_chunk":
            return []  # the agent replaying our own prompt
        if kind in _STATUS_UPDATES:
            detail = {key: value for key, value in body.items() if key != "sessionUpdate"}
            item = self.item("status", None, [{"type": "status", "label": kind, "detail": detail}], status="completed")
            return [("item.completed", {"item": item})]
        return [("agent.unparsed", {"error": f"unknown session update {kind!r}", "location": "session/update"})]

    def _chunk(self, slot: str, body: dict[str, Any]) -> list[Emitted]:
        content = body.get("content") or {}
        text = content.get("text", "") if isinstance(content, dict) else ""
        if not isinstance(text, str):  # `"text": null` or a number from a broken agent: nothing to add
            text = ""
        events: list[Emitted] = []
        item = self._open.get(slot)
        if item is None:
            part = (
                {"type": "text", "text": ""}
                if slot == "message"
                else {"type": "reasoning", "text": "", "visibility": "public"}
            )
            item = self._open[slot] = self.item("message", "assistant", [part])
            events.append(("item.started", {"item": copy.deepcopy(item)}))  # the open item grows with each delta
        item["content"][0]["text"] += text
        events.append(("item.delta", {"item_id": item["item_id"], "native_item_id": None, "delta": text}))
        if not self._in_turn:
            events += self._complete_open()
        return events

    def _tool_call(self, body: dict[str, Any]) -> list[Emitted]:
        events = self._complete_open()
        call_id = str(body.get("toolCallId", ""))
        call = {"type": "tool_call", "name": _tool_name(body), "arguments": _arguments(body), "call_id": call_id}
        item = self.item("tool_call", "assistant", [call], native_item_id=call_id, title=body.get("title"))
        self._tools[call_id] = item
        events.append(("item.started", {"item": item}))
        if body.get("status") in ("completed", "failed"):
            events += self._tool_update(body)
        return events

    def _tool_update(self, body: dict[str, Any]) -> list[Emitted]:
        call_id = str(body.get("toolCallId", ""))
        item = self._tools.get(call_id)
        if item is None:
            return self._tool_call(body | {"status": None}) + self._tool_update(body)
        if body.get("rawInput"):
            item["content"][0]["arguments"] = _arguments(body)
        if isinstance(body.get("title"), str):  # OpenCode names the tool first, then shows its command
            item["title"] = body["title"]
        streamed = ((body.get("_meta") or {}).get("terminal_output") or {}).get("data")
        if isinstance(streamed, str):
            self._terminal[call_id] = self._terminal.get(call_id, "") + streamed
        status = body.get("status")
        if status not in ("completed", "failed"):
            return []
        del self._tools[call_id]
        called = item | {"status": status}
        text = _output(body) or self._terminal.pop(call_id, "")
        output = {"type": "tool_result", "call_id": call_id, "output": text}
        result = self.item(
            "tool_result", "tool", [output], status=status, native_item_id=call_id, parent_id=item["item_id"]
        )
        return [("item.completed", {"item": called}), ("item.started", {"item": result}),
                ("item.completed", {"item": result})]  # fmt: skip


def _tool_name(body: dict[str, Any]) -> str:
    meta = body.get("_meta") or {}
    for value in meta.values() if isinstance(meta, dict) else ():
        if isinstance(value, dict) and isinstance(value.get("toolName"), str):
            return str(value["toolName"])
    return str(body.get("kind") or body.get("title") or "tool")


def _arguments(body: dict[str, Any]) -> str:
    return json.dumps(body.get("rawInput") or {}, separators=(",", ":"))


def _output(body: dict[str, Any]) -> str:
    """The tool's output as text: its `content` texts, else its `rawOutput`."""
    texts: list[str] = []
    for entry in body.get("content") or []:
        inner = entry.get("content") if isinstance(entry, dict) else None
        if isinstance(inner, dict) and inner.get("type") == "text":
            texts.append(str(inner.get("text", "")))
        elif isinstance(entry, dict) and entry.get("type") == "diff":
            texts.append(f"diff {entry.get('path', '')}")
    if texts:
        return "\n".join(texts)
    raw = body.get("rawOutput")
    if isinstance(raw, dict):
        for key in _OUTPUT_KEYS:
            if isinstance(raw.get(key), str):
                return str(raw[key])
    return "" if raw is None else raw if isinstance(raw, str) else json.dumps(raw)
