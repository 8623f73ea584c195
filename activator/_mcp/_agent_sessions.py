"""The coding-agent tools: start a session of a coding agent in a sandbox, prompt it, read its events, answer its
permission requests, list and terminate sessions, so an orchestrating agent can delegate a task.

They speak the universal session API of the sandbox's agent server (`executor.agent_api`, port 2468): every call
is one HTTP exchange on a socket of its own from `open_port` (which wakes a paused sandbox, as every tool does),
with the sandbox's envd access token as the Bearer token that server checks. A problem document it answers with
becomes a tool error with its `detail` and what to do next (`AgentRefused`).

Reading events can wait: while a turn runs and nothing in the page needs the caller (the turn ended, a permission
is requested), `getAgentSessionEvents` follows the session's SSE stream from where the page ended, up to
`waitSeconds`, so a model does not poll. What it returns is bounded: at most `limit` events and about
`MAX_EVENTS_BYTES` of them, then `hasMore` and the `nextOffset` to go on from.
"""

from __future__ import annotations

import asyncio
import secrets
from contextlib import aclosing
from typing import Any
from urllib.parse import quote

import msgspec
from msgspec import UNSET

from activator._activator import Activator
from activator._agent_archive import AgentArchive
from activator._errors import SandboxNotFound
from activator._mcp._agent_port import CREATE_DEADLINE, AgentPort, session_path
from activator._mcp._arguments import (
    CreateAgentSession,
    GetAgentSessionEvents,
    ListAgentSessions,
    PromptAgentSession,
    ReplyAgentPermission,
    TerminateAgentSession,
)
from activator._mcp._errors import AgentRefused, ExecutorFailed
from activator._mcp._output import Rendered
from activator._mcp._transcript import render
from executor.agent_api import (
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

__all__ = ["MAX_EVENTS_BYTES", "AgentSessionArgs", "run_agent_session_tool"]

AgentSessionArgs = (
    CreateAgentSession
    | PromptAgentSession
    | GetAgentSessionEvents
    | ReplyAgentPermission
    | ListAgentSessions
    | TerminateAgentSession
)

MAX_EVENTS_BYTES = 256 * 1024  # of events' JSON per call (at least one event, however large)
_HINTS = {
    "session_not_found": "listAgentSessions shows the sandbox's sessions; createAgentSession starts one",
    "session_already_exists": "use it (promptAgentSession), or create a session with another sessionId",
    "conflict": "a turn is running: read its events (getAgentSessionEvents waits for it) and prompt when it ended",
    "unsupported_agent": "listAgentSessions lists the agents this sandbox knows",
    "agent_not_installed": "listAgentSessions says which agents are installed (the coding-agents template has "
    "them all); mock is always there",
    "agent_process_exited": "the agent's stderr is in the message; check its env (credentials, base URL) and retry",
    "token_invalid": "the sandbox's access token was refused; recreate the sandbox",
}
_STOPS = frozenset({"turn.ended", "session.ended", "permission.requested", "question.requested"})
"""Events that end a wait: the caller has something to do (or nothing more will come this turn)."""


async def run_agent_session_tool(activator: Activator, owner: str, args: AgentSessionArgs) -> dict[str, Any] | Rendered:
    """Run one coding-agent tool for `owner`; reading a killed sandbox's sessions reads the control plane's copy."""
    try:
        port = AgentPort.of(activator, owner, args.sandbox_id, hints=_HINTS)
    except SandboxNotFound as gone:
        archive = activator.agent_archive
        if archive is None or not isinstance(args, GetAgentSessionEvents | ListAgentSessions):
            raise
        try:
            archive.sandbox(owner, args.sandbox_id)
        except SandboxNotFound:
            raise gone from None
        return _kept_events(archive, owner, args) if isinstance(args, GetAgentSessionEvents) else {
            "sandboxId": args.sandbox_id, "sessions": msgspec.to_builtins(archive.sessions(owner, args.sandbox_id)),
            "agents": [], "killed": True,
        }  # fmt: skip
    match args:
        case CreateAgentSession():
            return await _create(port, args)
        case PromptAgentSession():
            return await _prompt(port, args)
        case GetAgentSessionEvents():
            return await _events(port, args)
        case ReplyAgentPermission():
            path = f"{session_path(args.session_id)}/permissions/{quote(args.permission_id, safe='')}/reply"
            await port.call("POST", path, PermissionReply(args.reply))
            return {"sandboxId": args.sandbox_id, "sessionId": args.session_id, "permissionId": args.permission_id,
                    "reply": args.reply}  # fmt: skip
        case ListAgentSessions():
            return await _list(port, args)
        case TerminateAgentSession():
            await port.call("POST", f"{session_path(args.session_id)}/terminate")
            return {"sandboxId": args.sandbox_id, "sessionId": args.session_id, "terminated": True}


async def _create(port: AgentPort, args: CreateAgentSession) -> dict[str, Any]:
    session_id = args.session_id if args.session_id is not UNSET else f"session-{secrets.token_hex(4)}"
    request = CreateSessionRequest(
        agent=args.agent,
        agent_mode=_given(args.agent_mode),
        permission_mode=_given(args.permission_mode),
        model=_given(args.model),
        directory=_given(args.directory),
        env=args.env,
        permission_timeout_ms=args.permission_timeout_ms,
        permission_default=args.permission_default,
    )
    data = await port.call("POST", session_path(session_id), request, deadline=CREATE_DEADLINE)
    created = msgspec.json.decode(data, type=CreateSessionResponse)
    if not created.healthy:
        detail = created.error.detail if created.error is not None else "no reason given"
        raise AgentRefused(f"the {args.agent} agent did not start a session: {detail}", "agent_process_exited")
    return {
        "sandboxId": args.sandbox_id,
        "sessionId": session_id,
        "agent": args.agent,
        "nativeSessionId": created.native_session_id,
        "next": "promptAgentSession with this sessionId, then getAgentSessionEvents",
    }


async def _prompt(port: AgentPort, args: PromptAgentSession) -> dict[str, Any]:
    before = await port.decoded(SessionInfo, "GET", session_path(args.session_id))
    await port.call("POST", f"{session_path(args.session_id)}/messages", MessageRequest(args.message))
    return {
        "sandboxId": args.sandbox_id,
        "sessionId": args.session_id,
        "accepted": True,
        "offset": before.event_count,
        "next": f"getAgentSessionEvents with offset {before.event_count}: it waits for the turn to end or to ask "
        "for a permission",
    }


async def _events(port: AgentPort, args: GetAgentSessionEvents) -> Rendered:
    path = session_path(args.session_id)
    page = await port.decoded(EventPage, "GET", f"{path}/events?offset={args.offset}&limit={args.limit}")
    events = _bounded(page.events)
    info = await port.decoded(SessionInfo, "GET", path)
    # Wait only when the page is all there is (not cut by limit, size or hasMore) and nothing in it needs the caller.
    whole = len(events) == len(page.events) < args.limit and not page.has_more
    waiting_for_caller = bool(info.pending_permissions) or _stops(events)
    if args.wait_seconds > 0 and info.turn_active and not info.ended and whole and not waiting_for_caller:
        events += await _follow(port, f"{path}/events/sse?offset={args.offset + len(events)}", args, events)
        info = await port.decoded(SessionInfo, "GET", path)
    next_offset = args.offset + len(events)
    has_more = info.event_count > next_offset
    pending = info.pending_permissions  # the server's: also those requested before this page
    structured = _page(args, events, has_more, info)
    if pending:
        structured["pendingPermissions"] = pending
    footer = _footer(next_offset, has_more, info, pending)
    return Rendered(structured, render(structured["events"], next_offset=next_offset, footer=footer))


async def _follow(
    port: AgentPort, path: str, args: GetAgentSessionEvents, before: list[UniversalEvent]
) -> list[UniversalEvent]:
    """The events the SSE stream at `path` brings within `waitSeconds`, up to a stop event or the page's bounds."""
    followed: list[UniversalEvent] = []
    size = sum(_size(event) for event in before)
    try:
        async with asyncio.timeout(args.wait_seconds):
            async with aclosing(port.follow(path)) as frames:  # closed (and its socket) when we stop reading
                async for data in frames:
                    try:
                        event = msgspec.json.decode(data, type=UniversalEvent)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        raise ExecutorFailed(f"the session's event stream sent something else: {exc}") from exc
                    size += _size(event)
                    if (before or followed) and size > MAX_EVENTS_BYTES:
                        break
                    followed.append(event)
                    if event.type in _STOPS or len(before) + len(followed) >= args.limit:
                        break
    except TimeoutError:
        pass  # waited long enough: what came is the answer (nothing is lost: nextOffset is after it)
    return followed


def _kept_events(archive: AgentArchive, owner: str, args: GetAgentSessionEvents) -> Rendered:
    """`getAgentSessionEvents` of a killed sandbox: its events as the control plane kept them, same offsets."""
    info = archive.info(owner, args.sandbox_id, args.session_id)  # ended, no turn: its sandbox was killed
    kept = archive.events(owner, args.sandbox_id, args.session_id, args.offset, args.limit)
    events = _bounded(kept.events)
    next_offset = args.offset + len(events)
    has_more = kept.has_more or len(events) < len(kept.events)
    structured = _page(args, events, has_more, info) | {"killed": True}
    where = f"nextOffset {next_offset}"
    footer = (
        f"{where}; more events are kept: call getAgentSessionEvents again with offset {next_offset}"
        if has_more
        else f"{where}; the sandbox was killed (agent: {info.agent}): this is the control plane's copy of the session"
    )
    return Rendered(structured, render(structured["events"], next_offset=next_offset, footer=footer))


def _page(
    args: GetAgentSessionEvents, events: list[UniversalEvent], has_more: bool, info: SessionInfo
) -> dict[str, Any]:
    """The structured answer of `getAgentSessionEvents`, live or kept."""
    return {
        "sandboxId": args.sandbox_id,
        "sessionId": args.session_id,
        "events": msgspec.to_builtins(events),
        "nextOffset": args.offset + len(events),
        "hasMore": has_more,
        "turnActive": info.turn_active,
        "ended": info.ended,
    }


def _stops(events: list[UniversalEvent]) -> bool:
    return any(event.type in _STOPS for event in events)


def _bounded(events: list[UniversalEvent]) -> list[UniversalEvent]:
    """The first events of `events` whose JSON fits `MAX_EVENTS_BYTES` (the first one in any case)."""
    size = 0
    for index, event in enumerate(events):
        size += _size(event)
        if index and size > MAX_EVENTS_BYTES:
            return events[:index]
    return events


def _size(event: UniversalEvent) -> int:
    return len(msgspec.json.encode(event))


def _footer(next_offset: int, has_more: bool, info: SessionInfo, pending: list[str]) -> str:
    """What the page means for the caller's next step."""
    where = f"nextOffset {next_offset}"
    if has_more:
        return f"{where}; more events are there: call getAgentSessionEvents again with offset {next_offset}"
    if info.ended:
        return f"{where}; the session has ended"
    if pending:
        return f"{where}; the agent waits for replyAgentPermission on {', '.join(pending)}"
    if info.turn_active:
        return f"{where}; the turn is still running: call getAgentSessionEvents again with offset {next_offset}"
    return f"{where}; no turn is running: send the next message with promptAgentSession"


def _list_agents(agents: AgentList) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = []
    for agent in agents.agents:
        entry: dict[str, Any] = {"id": agent.id, "installed": agent.installed}
        if agent.version:
            entry["version"] = agent.version
        entry["credentialsAvailable"] = agent.credentials_available
        if agent.reason:
            entry["reason"] = agent.reason
        listed.append(entry)
    return listed


async def _list(port: AgentPort, args: ListAgentSessions) -> dict[str, Any]:
    sessions = await port.decoded(SessionList, "GET", "/v1/sessions")
    agents = await port.decoded(AgentList, "GET", "/v1/agents")
    return {
        "sandboxId": args.sandbox_id,
        "sessions": msgspec.to_builtins(sessions.sessions),
        "agents": _list_agents(agents),
    }


def _given(value: str | msgspec.UnsetType) -> str | None:
    return None if isinstance(value, msgspec.UnsetType) else value
