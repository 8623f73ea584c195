"""A page of a coding-agent session's universal events as a transcript a model reads at a glance.

One line per thing that happened, prefixed with the event's sequence (`#12`): the user's and the agent's messages,
its reasoning, each tool call with its result, permission requests (with how to answer them) and their outcome,
errors, turns starting and ending. A message or tool call is shown once, whole, at the event that completed it
(its `item.started` and `item.delta` events are folded into it); one still open at the end of the page is shown
as far as it got, marked `(in progress)`. Long texts keep their head and tail around a marker; the events
themselves, uncut, are the tool's structured content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["render"]

_MESSAGE_CHARS = 8000
_THINKING_CHARS = 1500
_ARGUMENTS_CHARS = 1000
_OUTPUT_CHARS = 4000
_OTHER_CHARS = 600


@dataclass
class _Item:
    """One item of the session as the page shows it: its last known state and the text its deltas added."""

    sequence: int
    item: dict[str, Any] | None = None
    deltas: list[str] = field(default_factory=list)
    completed: bool = False


def render(events: list[dict[str, Any]], *, next_offset: int, footer: str) -> str:
    """The transcript of `events` (the structured form of `UniversalEvent`s), then `footer`."""
    lines: list[tuple[int, str]] = []
    items: dict[str, _Item] = {}
    for event in events:
        sequence, kind, data = int(event.get("sequence", 0)), str(event.get("type", "")), event.get("data") or {}
        if kind in ("item.started", "item.completed"):
            item = data.get("item") or {}
            entry = items.setdefault(str(item.get("item_id", "")), _Item(sequence))
            entry.item = item
            if kind == "item.completed":
                entry.completed = True
                lines.append((sequence, _item_line(item, "".join(entry.deltas))))
        elif kind == "item.delta":
            entry = items.setdefault(str(data.get("item_id", "")), _Item(sequence))
            entry.deltas.append(str(data.get("delta", "")))
        else:
            lines.append((sequence, _event_line(kind, data)))
    for entry in items.values():
        if not entry.completed:
            lines.append((entry.sequence, _item_line(entry.item or {}, "".join(entry.deltas), open_=True)))
    lines.sort(key=lambda line: line[0])
    body = [f"#{sequence} {text}" for sequence, text in lines]
    if not events:
        body.append(f"(no events after offset {next_offset})")
    return "\n".join([*body, "--", footer])


def _item_line(item: dict[str, Any], streamed: str, *, open_: bool = False) -> str:
    """A message, reasoning, tool call, tool result or status item; `streamed` is what its deltas in this page
    added (the text of an item that is still open, whose started event held none of it)."""
    kind, role = item.get("kind"), item.get("role")
    parts = [part for part in item.get("content") or [] if isinstance(part, dict)]
    first = parts[0] if parts else {}
    progress = " (in progress)" if open_ else ""
    if kind == "message":
        text = "".join(str(part.get("text", "")) for part in parts) or streamed
        if first.get("type") == "reasoning":
            return f"thinking{progress}: {_cut(text, _THINKING_CHARS)}"
        who = "user" if role == "user" else "agent"
        return f"{who}{progress}: {_indent(_cut(text, _MESSAGE_CHARS))}"
    if kind == "tool_call":
        name = first.get("name") or "tool"
        title = item.get("title")
        called = f"{name} {title!r}" if title and title != name else str(name)
        status = "in progress" if open_ else str(item.get("status", ""))
        arguments = _cut(str(first.get("arguments") or "{}"), _ARGUMENTS_CHARS)
        return f"tool call {item.get('item_id')} {called} {arguments} [{status}]"
    if kind == "tool_result":
        output = str(first.get("output", ""))
        shown = _indent(_cut(output, _OUTPUT_CHARS)) if output else "(no output)"
        return f"tool result of {item.get('parent_id')} [{item.get('status', '')}]: {shown}"
    if kind == "status":
        detail = first.get("detail") or {}
        said = detail.get("detail") if isinstance(detail, dict) else None
        return f"status {first.get('label', '')}" + (f": {said}" if said else "")
    return f"{kind} item{progress}: {_compact(item)}"


def _event_line(kind: str, data: dict[str, Any]) -> str:
    match kind:
        case "turn.started":
            return "turn started"
        case "turn.ended":
            reason = f" ({data['stop_reason']})" if data.get("stop_reason") else ""
            return f"turn ended: {data.get('phase', '')}{reason}"
        case "session.started":
            return "session started"
        case "session.ended":
            return f"session ended: {data.get('reason', '')}"
        case "permission.requested":
            options = (data.get("metadata") or {}).get("options") or []
            offered = ", ".join(str(option.get("kind") or option.get("optionId")) for option in options)
            return (
                f"PERMISSION REQUESTED {data.get('permission_id')}: {data.get('action')}"
                + (f" (offers {offered})" if offered else "")
                + f' -> replyAgentPermission {{"permissionId": "{data.get("permission_id")}", '
                '"reply": "once" | "always" | "reject"}'
            )
        case "permission.resolved":
            metadata = data.get("metadata") or {}
            reply = f"{metadata.get('reply')} by {metadata.get('resolved_by')}"
            return f"permission {data.get('permission_id')} {data.get('status')} ({reply})"
        case "error":
            details = data.get("details") or {}
            stderr = str(details.get("stderr") or "") if isinstance(details, dict) else ""
            line = f"ERROR {data.get('code', '')}: {data.get('message', '')}"
            return line + (f"\n  stderr: {_indent(_cut(stderr, _OUTPUT_CHARS))}" if stderr else "")
        case "agent.unparsed":
            return f"unparsed agent message: {data.get('error', '')}"
    return f"{kind}: {_compact(data)}"


def _cut(text: str, limit: int) -> str:
    """`text`, or its head and tail around a marker when it is longer than `limit` characters."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return (
        f"{text[:half]}[... {len(text) - 2 * half} characters cut: the whole text is in the events ...]{text[-half:]}"
    )


def _indent(text: str) -> str:
    """Continuation lines indented, so every line of the transcript that starts with `#` starts an event."""
    return text.rstrip("\n").replace("\n", "\n  ")


def _compact(value: Any) -> str:
    return _cut(json.dumps(value, ensure_ascii=False, separators=(",", ":")), _OTHER_CHARS)
