"""The universal session API (sandbox-agent v0.1's, coding-agents.md §4), over `Sessions`.

    GET  /v1/sessions                                  {sessions: [SessionInfo]}, newest first
    POST /v1/sessions/{id}                             CreateSessionRequest → {healthy, nativeSessionId}
    GET  /v1/sessions/{id}                             SessionInfo
    POST /v1/sessions/{id}/messages                    {message} → 204; the turn runs on (409 while one runs)
    POST /v1/sessions/{id}/messages/stream             the same, answered with this turn's events over SSE
    GET  /v1/sessions/{id}/events?offset&limit         {events, hasMore}: sequence > offset
    GET  /v1/sessions/{id}/events/sse?offset           the events after offset, then live
    POST /v1/sessions/{id}/permissions/{pid}/reply     {reply: once|always|reject} → 204
    POST /v1/sessions/{id}/questions/{qid}/reply|reject  400: no ACP agent asks questions this way
    POST /v1/sessions/{id}/cancel                      204: the running turn is cancelled
    POST /v1/sessions/{id}/terminate                   204, idempotent: the agent is stopped, the log kept

`include_raw` is refused (400): the events keep no native payload; the ACP stream has it.
"""

from __future__ import annotations

import re

import msgspec

from executor._agents._acp_routes import OPENING_ERRORS, opening_error
from executor._agents._acp_server import AgentExited
from executor._agents._http import ApiError, count, follow, read_json, send_json
from executor._agents._sessions import (
    AgentError,
    Session,
    SessionExists,
    Sessions,
    SessionTerminated,
    TurnActive,
    UnknownPermission,
)
from executor._exchange import Request, Response
from executor.agent_api import (
    SESSION_ID_PATTERN,
    CreateSessionRequest,
    CreateSessionResponse,
    EventPage,
    MessageRequest,
    PermissionReply,
    SessionList,
    UniversalEvent,
)

__all__ = ("MAX_EVENTS_PAGE", "SessionRoutes")

SESSION_ID = re.compile(SESSION_ID_PATTERN)
MAX_EVENTS_PAGE = 10_000
DEFAULT_EVENTS_PAGE = 1_000
_TURN_ENDS = (b'"type":"turn.ended"', b'"type":"session.ended"', b'"type":"permission.requested"')

_events = msgspec.json.Decoder(UniversalEvent)


class SessionRoutes:
    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise ApiError("session_not_found", 404, f"session not found: {session_id}", sessionId=session_id)
        return session

    async def list(self, request: Request, response: Response) -> None:
        await send_json(response, 200, SessionList([session.info() for session in self._sessions.newest_first()]))

    async def create(self, request: Request, response: Response, session_id: str) -> None:
        if not SESSION_ID.fullmatch(session_id):
            raise ApiError("invalid_request", 400, f"invalid session id '{session_id}': use 1-128 of [A-Za-z0-9._-]")
        options = await read_json(request, CreateSessionRequest)
        if not 1_000 <= options.permission_timeout_ms <= 86_400_000:
            raise ApiError("invalid_request", 400, "permissionTimeoutMs must be between 1000 and 86400000")
        if options.variant is not None or options.agent_version is not None:  # refused, never silently ignored
            detail = "variant and agentVersion are not supported: an agent runs at its installed version (install it)"
            raise ApiError("invalid_request", 400, detail, sessionId=session_id)
        try:
            session = await self._sessions.create(session_id, options)
        except SessionExists as exc:
            raise ApiError("session_already_exists", 409, str(exc), sessionId=session_id) from exc
        except OPENING_ERRORS as exc:
            raise opening_error(exc, options.agent) from exc
        except AgentError as exc:  # e.g. a mode or model the agent does not have
            raise ApiError(
                "invalid_request", 400, f"the {options.agent} agent refused: {exc}", sessionId=session_id
            ) from exc
        except (AgentExited, ConnectionError, TimeoutError) as exc:
            detail = f"the {options.agent} agent did not start a session: {exc or 'no answer'}"
            raise ApiError("agent_process_exited", 502, detail, sessionId=session_id, agent=options.agent) from exc
        await send_json(response, 200, CreateSessionResponse(True, session.record.native_session_id))

    async def get(self, request: Request, response: Response, session_id: str) -> None:
        await send_json(response, 200, self._session(session_id).info())

    async def message(self, request: Request, response: Response, session_id: str) -> None:
        await self._send(request, session_id)
        await response.send(204)

    async def message_stream(self, request: Request, response: Response, session_id: str) -> None:
        _refuse_raw(request)
        session = self._session(session_id)
        before = len(session.log)
        await self._send(request, session_id)
        await follow(response, session.log, before, until=lambda record: any(end in record for end in _TURN_ENDS))

    async def _send(self, request: Request, session_id: str) -> None:
        session = self._session(session_id)
        body = await read_json(request, MessageRequest)
        try:
            await session.send(body.message)
        except SessionTerminated as exc:
            raise ApiError("invalid_request", 400, str(exc), sessionId=session_id) from exc
        except TurnActive as exc:
            raise ApiError("conflict", 409, str(exc), sessionId=session_id) from exc

    async def events(self, request: Request, response: Response, session_id: str) -> None:
        _refuse_raw(request)
        session = self._session(session_id)
        offset = _integer(request, "offset", 0, 0, None)
        limit = _integer(request, "limit", DEFAULT_EVENTS_PAGE, 1, MAX_EVENTS_PAGE)
        records = session.log.read(offset, limit + 1)
        page = EventPage([_events.decode(record) for record in records[:limit]], len(records) > limit)
        await send_json(response, 200, page)

    async def events_sse(self, request: Request, response: Response, session_id: str) -> None:
        _refuse_raw(request)
        session = self._session(session_id)
        await follow(response, session.log, _integer(request, "offset", 0, 0, None))

    async def reply_permission(self, request: Request, response: Response, session_id: str, permission_id: str) -> None:
        session = self._session(session_id)
        body = await read_json(request, PermissionReply)
        try:
            await session.reply_permission(permission_id, body.reply)
        except UnknownPermission as exc:
            raise ApiError("invalid_request", 400, str(exc), sessionId=session_id) from exc
        await response.send(204)

    async def question(self, request: Request, response: Response, session_id: str, question_id: str) -> None:
        self._session(session_id)
        raise ApiError("invalid_request", 400, f"no pending question {question_id}: ACP agents ask through permissions")

    async def cancel(self, request: Request, response: Response, session_id: str) -> None:
        await self._session(session_id).cancel()
        await response.send(204)

    async def terminate(self, request: Request, response: Response, session_id: str) -> None:
        await self._session(session_id).terminate()
        await response.send(204)


def _refuse_raw(request: Request) -> None:
    if request.query.get("include_raw", "").lower() in ("1", "true", "yes"):
        raise ApiError("invalid_request", 400, "include_raw is not supported: the raw ACP messages are on /v1/acp")


def _integer(request: Request, name: str, default: int, low: int, high: int | None) -> int:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    number = count(value)
    if number is None or number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError("invalid_request", 400, f"{name} must be an integer {bound}")
    return number
