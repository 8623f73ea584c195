"""The control plane's copy of the sandboxes' coding-agent sessions (ours, not E2B's; `activator._agent_archive`).

    GET /agent-sessions?limit&nextToken                           the newest sessions kept of the key's sandboxes
    GET /sandboxes/{id}/agent-sessions                            one sandbox's, live or killed
    GET /sandboxes/{id}/agent-sessions/{sessionID}/events         its events after `offset`, at most `limit`

A running sandbox's sessions are copied within about a second (`activator._agent_mirror`), and whole before it is
paused, snapshotted or killed; after `kill` they stay readable for the server's `--agent-session-retention`, with
the offsets the sandbox's own API (port 2468) gave. 501 where no copy is kept (the kubernetes runtime). A killed
sandbox's sessions read as ended, with nothing pending; `eventCount` is the number of events kept.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from litestar import Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import PathParameter, QueryParameter

from activator._agent_archive import AgentArchive, ArchivedSession
from activator._e2b import _wire
from activator._e2b._info_routes import NEXT_TOKEN
from activator._e2b._openapi import keyed_errors
from activator._e2b._state import ActivatorDep, OwnerDep, SandboxIdPath
from activator._errors import InvalidRequest, NotSupported
from executor.agent_api import SESSION_ID_PATTERN, EventPage

__all__ = ["AGENT_SESSION_ROUTES", "MAX_KEPT_EVENTS_PAGE"]

MAX_KEPT_EVENTS_PAGE = 10_000  # as the sandbox's own events route
MAX_LISTED = 1_000  # sessions one listing returns
_MAX_TOKEN = 256  # characters of a nextToken: a creation time, a sandbox id (64) and a session id (128), with "~"s
_SessionIdPath = Annotated[str, PathParameter(pattern=SESSION_ID_PATTERN)]


def _archive(activator: ActivatorDep) -> AgentArchive:
    if activator.agent_archive is None:
        raise NotSupported("a copy of coding-agent sessions is kept on the local runtime only: read them from the "
                           "sandbox's own agent server (port 2468) while it lives")  # fmt: skip
    return activator.agent_archive


@get("/agent-sessions", responses=keyed_errors(400, 501), response_headers=[NEXT_TOKEN])
async def list_kept_sessions(
    activator: ActivatorDep,
    owner: OwnerDep,
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_LISTED)] = 100,
    next_token: Annotated[str | None, QueryParameter(name="nextToken", max_length=_MAX_TOKEN)] = None,
) -> Response[list[_wire.KeptAgentSession]]:
    """The key's coding-agent sessions kept, live or killed, newest first; `X-Next-Token` when more follow (a place
    in the listing: a copy deleted while paging loses nothing else)."""
    found = _archive(activator).across(owner)
    if next_token is not None:
        after = _decode_token(next_token)
        found = [one for one in found if one.key() < after]
    page = found[:limit]
    headers = {"X-Next-Token": "~".join(page[-1].key())} if len(found) > limit else {}
    return Response([_kept(one) for one in page], headers=headers)


def _kept(one: ArchivedSession) -> _wire.KeptAgentSession:
    return _wire.KeptAgentSession(
        sandbox_id=one.sandbox_id, template_id=one.sandbox.template, session=one.info,
        sandbox_ended_at=_time(one.sandbox.ended_at),
    )  # fmt: skip


def _decode_token(token: str) -> tuple[str, str, str]:
    parts = token.split("~")
    if len(parts) != 3:
        raise InvalidRequest(f"nextToken {token!r} is not one this listing gave")
    return parts[0], parts[1], parts[2]


@get("/sandboxes/{sandbox_id:str}/agent-sessions", responses=keyed_errors(400, 404, 501))
async def kept_sessions(sandbox_id: SandboxIdPath, activator: ActivatorDep, owner: OwnerDep) -> _wire.AgentSessionsKept:
    """The sandbox's coding-agent sessions as the control plane keeps them; 404 when none are kept."""
    archive = _archive(activator)
    sandbox = archive.sandbox(owner, sandbox_id)
    return _wire.AgentSessionsKept(
        sandbox_id=sandbox_id, sessions=archive.sessions(owner, sandbox_id), ended_at=_time(sandbox.ended_at),
        truncated=sandbox.truncated,
    )  # fmt: skip


@get("/sandboxes/{sandbox_id:str}/agent-sessions/{session_id:str}/events", responses=keyed_errors(400, 404, 501))
async def kept_events(
    sandbox_id: SandboxIdPath,
    session_id: _SessionIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    offset: Annotated[int, QueryParameter(ge=0)] = 0,
    limit: Annotated[int, QueryParameter(ge=1, le=MAX_KEPT_EVENTS_PAGE)] = 1_000,
) -> EventPage:
    """The session's kept events with `sequence > offset`, at most `limit`; `hasMore` when more are kept."""
    return _archive(activator).events(owner, sandbox_id, session_id, offset, limit)


def _time(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


AGENT_SESSION_ROUTES: list[HTTPRouteHandler] = [list_kept_sessions, kept_sessions, kept_events]
