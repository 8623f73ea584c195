"""The Sessions tab of a sandbox's page: the coding-agent sessions of its agent server (port 2468), one session's
transcript, its permission requests, a prompt box, and a form that starts a session.

The HTML is rendered here, from the Jinja2 templates (autoescaped: whatever an agent writes is untrusted text and
is shown as text), and fetched by the page's script as fragments (`GET .../agent-sessions`, `GET
.../agent-sessions/<sid>`), which it polls while a turn runs. The state changes are POSTs with the session's CSRF
token like every other action. Behind them, the same client as MCP's coding-agent tools (`AgentPort`): one
exchange per call on a socket from the activator, with the sandbox's access token as the Bearer token.

Like processes and files, these calls reach into the sandbox: they wake one the idle policy paused and count as
its traffic; a sandbox its user paused answers 409 (resume it first) instead of being resumed.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import msgspec
from litestar import Response, get, post
from litestar.exceptions import ValidationException
from litestar.params import FromPath, JSONBody

from activator import CREATE_DEADLINE, AgentPort, AgentRefused, SandboxConflict, session_path
from executor.agent_api import (
    AgentInfo,
    AgentList,
    CreateSessionRequest,
    CreateSessionResponse,
    EventPage,
    MessageRequest,
    PermissionReply,
    SessionInfo,
    SessionList,
    UniversalEvent,
)
from gateway.ui._auth import SessionDep
from gateway.ui._context import SandboxIdPath, UiContext, UiDep
from gateway.ui._render import page

__all__ = ["AGENT_SESSION_ROUTES", "Entry", "transcript"]

MAX_SHOWN_EVENTS = 2000  # the newest events of a session its transcript shows
_PAGE = 1000  # events per read (the agent server's largest page)
_TEXT_CHARS = 20_000  # of one message, reasoning, arguments or output; the rest is cut with a note
_DEFAULT_AGENT = "mock"

SessionIdPath = FromPath[str]  # handler parameter `session_id`


class CreateForm(msgspec.Struct, kw_only=True, rename="camel"):
    agent: str = _DEFAULT_AGENT
    session_id: str = ""


class MessageForm(msgspec.Struct):
    message: str


class ReplyForm(msgspec.Struct):
    reply: Literal["once", "always", "reject"]


@dataclass
class Entry:
    """One line of a transcript: a message, reasoning, a tool call (with its result), a permission request, a
    status, an error or a turn/session boundary; `text` is shown as text, never as HTML."""

    sequence: int
    kind: str  # user | agent | reasoning | tool | permission | status | error | event
    text: str = ""
    title: str = ""  # a tool call's name, a permission's action
    arguments: str = ""
    output: str | None = None  # a tool call's result (None: none yet)
    status: str = ""
    open: bool = False  # still streaming
    permission_id: str = ""
    pending: bool = False  # a permission request waiting for a reply
    deltas: list[str] = field(default_factory=list)


# --- reading -------------------------------------------------------------------------------------------------


@get("/api/sandboxes/{sandbox_id:str}/agent-sessions")
async def sessions_fragment(ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath) -> Response[str]:
    """The sessions of the sandbox's agent server, newest first, and the form that starts one (HTML)."""
    port = _port(ui, session.owner, sandbox_id)
    listed = await port.decoded(SessionList, "GET", "/v1/sessions")
    agents = await port.decoded(AgentList, "GET", "/v1/agents")
    return page(
        ui, "agent_sessions.html", session=session, sandbox_id=sandbox_id, sessions=listed.sessions,
        agents=_agent_choices(agents.agents), default_agent=_DEFAULT_AGENT,
    )  # fmt: skip


@get("/api/sandboxes/{sandbox_id:str}/agent-sessions/{session_id:str}")
async def transcript_fragment(
    ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath, session_id: SessionIdPath
) -> Response[str]:
    """One session: its state, its transcript (the newest `MAX_SHOWN_EVENTS` events) and its pending permission
    requests with their buttons (HTML). `data-live` on its root tells the page to poll again."""
    port = _port(ui, session.owner, sandbox_id)
    path = session_path(session_id)
    info = await port.decoded(SessionInfo, "GET", path)
    first = max(0, info.event_count - MAX_SHOWN_EVENTS)
    events: list[UniversalEvent] = []
    offset = first
    while len(events) < MAX_SHOWN_EVENTS:
        got = await port.decoded(EventPage, "GET", f"{path}/events?offset={offset}&limit={_PAGE}")
        events += got.events
        offset += len(got.events)
        if not got.has_more or not got.events:
            break
    entries = transcript(events, pending=set(info.pending_permissions))
    live = not info.ended and (info.turn_active or bool(info.pending_permissions))
    return page(
        ui, "agent_transcript.html", session=session, sandbox_id=sandbox_id, info=info, entries=entries,
        skipped=first, live=live, kept=False,
    )  # fmt: skip


# --- state changes -------------------------------------------------------------------------------------------


@post("/api/sandboxes/{sandbox_id:str}/agent-sessions", status_code=200)
async def create_session(
    ui: UiDep, action_session: SessionDep, sandbox_id: SandboxIdPath, data: JSONBody[CreateForm]
) -> dict[str, Any]:
    """Start a session of `agent` (its id given, or made up); `{sessionId}` once the agent runs."""
    session_id = data.session_id.strip() or f"session-{secrets.token_hex(4)}"
    agent = data.agent.strip()
    if not agent:
        raise ValidationException("choose an agent")
    port = _port(ui, action_session.owner, sandbox_id)
    answer = await port.call(
        "POST", session_path(session_id), CreateSessionRequest(agent=agent), deadline=CREATE_DEADLINE
    )
    created = msgspec.json.decode(answer, type=CreateSessionResponse)
    if not created.healthy:
        detail = created.error.detail if created.error is not None else "no reason given"
        raise AgentRefused(f"the {agent} agent did not start a session: {detail}", "agent_process_exited")
    return {"sessionId": session_id}


@post("/api/sandboxes/{sandbox_id:str}/agent-sessions/{session_id:str}/messages", status_code=200)
async def send_message(
    ui: UiDep,
    action_session: SessionDep,
    sandbox_id: SandboxIdPath,
    session_id: SessionIdPath,
    data: JSONBody[MessageForm],
) -> dict[str, Any]:
    """Send a prompt; 409 while a turn runs."""
    if not data.message.strip():
        raise ValidationException("write a message first")
    port = _port(ui, action_session.owner, sandbox_id)
    await port.call("POST", f"{session_path(session_id)}/messages", MessageRequest(data.message))
    return {"ok": True}


@post(
    "/api/sandboxes/{sandbox_id:str}/agent-sessions/{session_id:str}/permissions/{permission_id:str}",
    status_code=200,
)
async def reply_permission(
    ui: UiDep,
    action_session: SessionDep,
    sandbox_id: SandboxIdPath,
    session_id: SessionIdPath,
    permission_id: FromPath[str],
    data: JSONBody[ReplyForm],
) -> dict[str, Any]:
    """Answer a permission request: `once` / `always` (approve) or `reject` (deny)."""
    port = _port(ui, action_session.owner, sandbox_id)
    path = f"{session_path(session_id)}/permissions/{quote(permission_id, safe='')}/reply"
    await port.call("POST", path, PermissionReply(data.reply))
    return {"ok": True}


@post("/api/sandboxes/{sandbox_id:str}/agent-sessions/{session_id:str}/terminate", status_code=200)
async def terminate_session(
    ui: UiDep, action_session: SessionDep, sandbox_id: SandboxIdPath, session_id: SessionIdPath
) -> dict[str, Any]:
    """End the session and its agent process; its transcript stays readable."""
    port = _port(ui, action_session.owner, sandbox_id)
    await port.call("POST", f"{session_path(session_id)}/terminate")
    return {"ok": True}


# --- the transcript ------------------------------------------------------------------------------------------


def transcript(events: list[UniversalEvent], *, pending: set[str]) -> list[Entry]:
    """The entries `events` make, in order: an item is shown once, at the event that started it (or its first
    delta), as far as its deltas and its completion got; a tool result joins its tool call."""
    entries: list[Entry] = []
    items: dict[str, Entry] = {}
    calls: dict[str, Entry] = {}  # a tool call's item id -> its entry, for its result
    permissions: dict[str, Entry] = {}
    for event in events:
        data = event.data
        if event.type in ("item.started", "item.completed"):
            item = _mapping(data.get("item"))
            item_id = str(item.get("item_id", ""))
            entry = items.get(item_id)
            if entry is None:
                entry = items[item_id] = Entry(event.sequence, "status")
                parent = calls.get(str(item.get("parent_id") or ""))
                if item.get("kind") != "tool_result" or parent is None:
                    entries.append(entry)
            _apply_item(entry, item, completed=event.type == "item.completed", calls=calls, item_id=item_id)
        elif event.type == "item.delta":
            item_id = str(data.get("item_id", ""))
            entry = items.get(item_id)
            if entry is None:
                entry = items[item_id] = Entry(event.sequence, "agent", open=True)
                entries.append(entry)
            entry.deltas.append(str(data.get("delta", "")))
            if entry.kind in ("agent", "user", "reasoning") and entry.open:
                entry.text = _cut("".join(entry.deltas))
        elif event.type == "permission.requested":
            permission_id = str(data.get("permission_id", ""))
            entry = Entry(
                event.sequence, "permission", title=str(data.get("action", "")), permission_id=permission_id,
                status="pending" if permission_id in pending else str(data.get("status", "requested")),
                pending=permission_id in pending,
            )  # fmt: skip
            permissions[permission_id] = entry
            entries.append(entry)
        elif event.type == "permission.resolved":
            permission_id = str(data.get("permission_id", ""))
            found = permissions.get(permission_id)
            metadata = _mapping(data.get("metadata"))
            said = f"{data.get('status', 'resolved')}" + (f" ({metadata['reply']})" if metadata.get("reply") else "")
            if found is not None:
                found.status, found.pending = said, permission_id in pending
            else:
                entries.append(Entry(event.sequence, "permission", permission_id=permission_id, status=said))
        else:
            entries.append(_event_entry(event))
    return entries


def _apply_item(entry: Entry, item: dict[str, Any], *, completed: bool, calls: dict[str, Entry], item_id: str) -> None:
    kind, role = item.get("kind"), item.get("role")
    parts = [part for part in item.get("content") or [] if isinstance(part, dict)]
    first = parts[0] if parts else {}
    streamed = "".join(entry.deltas)
    entry.open = not completed
    entry.status = str(item.get("status") or "")
    if kind == "message":
        entry.kind = "reasoning" if first.get("type") == "reasoning" else ("user" if role == "user" else "agent")
        entry.text = _cut("".join(str(part.get("text") or "") for part in parts) or streamed)
    elif kind == "tool_call":
        entry.kind = "tool"
        name, title = str(first.get("name") or "tool"), item.get("title")
        entry.title = f"{name}: {title}" if isinstance(title, str) and title and title != name else name
        arguments = first.get("arguments")
        entry.arguments = _cut(arguments if isinstance(arguments, str) else msgspec.json.encode(arguments).decode())
        calls[item_id] = entry
    elif kind == "tool_result":
        output = _cut(str(first.get("output") or ""))
        parent = calls.get(str(item.get("parent_id") or ""))
        if parent is not None:
            parent.output = output
            parent.status = entry.status or parent.status
        else:
            entry.kind, entry.title, entry.output = "tool", "tool result", output
    elif kind == "status":
        detail = first.get("detail")
        said = detail.get("detail") if isinstance(detail, dict) else None
        entry.kind, entry.text = "status", str(first.get("label") or "") + (f": {said}" if said else "")
    else:
        entry.kind, entry.text = "status", f"{kind} item"


def _event_entry(event: UniversalEvent) -> Entry:
    data = event.data
    match event.type:
        case "turn.started":
            return Entry(event.sequence, "event", text="turn started")
        case "turn.ended":
            reason = f" ({data['stop_reason']})" if data.get("stop_reason") else ""
            return Entry(event.sequence, "event", text=f"turn ended: {data.get('phase', '')}{reason}")
        case "session.started":
            return Entry(event.sequence, "event", text="session started")
        case "session.ended":
            return Entry(event.sequence, "event", text=f"session ended: {data.get('reason', '')}")
        case "error":
            details = _mapping(data.get("details"))
            stderr = str(details.get("stderr") or "")
            text = f"{data.get('code', 'error')}: {data.get('message', '')}"
            return Entry(event.sequence, "error", text=_cut(text), output=_cut(stderr) if stderr else None)
        case "question.requested":
            return Entry(event.sequence, "status", text="the agent asks a question (answer it through the API)")
    return Entry(event.sequence, "event", text=event.type)


# --- helpers -------------------------------------------------------------------------------------------------


def _port(ui: UiContext, owner: str, sandbox_id: str) -> AgentPort:
    """The agent server of a sandbox the session may reach (SandboxConflict while its user keeps it paused)."""
    record = ui.services.activator.get(owner, sandbox_id)  # 404 when gone or another key's
    if record.user_paused:
        raise SandboxConflict(f"sandbox {record.id} is {record.state.value}: resume it to use its sessions")
    return AgentPort.of(ui.services.activator, owner, sandbox_id)


def _agent_choices(agents: list[AgentInfo]) -> list[dict[str, Any]]:
    return [
        {"id": agent.id, "installed": agent.installed, "note": agent.reason or "not installed"}
        for agent in sorted(agents, key=lambda agent: (agent.id != _DEFAULT_AGENT, not agent.installed, agent.id))
    ]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _cut(text: str) -> str:
    if len(text) <= _TEXT_CHARS:
        return text
    half = _TEXT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


AGENT_SESSION_ROUTES = [
    sessions_fragment, transcript_fragment, create_session, send_message, reply_permission, terminate_session,
]  # fmt: skip
