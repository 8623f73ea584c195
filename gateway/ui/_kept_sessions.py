"""The Sessions page: the coding-agent sessions of every sandbox of the key, from the control plane's copy
(`activator.AgentArchive`), and the transcript of one of them, also after its sandbox was killed.

Read from the copy, never from the sandboxes: listing them wakes none, and a killed sandbox's sessions are still
there for the server's `--agent-session-retention`. A live sandbox's session links to its Sessions tab, where it is
followed live and answered.
"""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Response, get

from activator import AgentArchive, SandboxNotFound
from executor.agent_api import SessionInfo
from gateway.ui._agent_sessions import MAX_SHOWN_EVENTS, SessionIdPath, transcript
from gateway.ui._auth import SessionDep
from gateway.ui._context import SandboxIdPath, UiContext, UiDep
from gateway.ui._render import page

__all__ = ["KEPT_SESSION_ROUTES", "MAX_LISTED_SESSIONS"]

MAX_LISTED_SESSIONS = 500  # the newest sessions the page lists


@dataclass(frozen=True)
class ListedSession:
    sandbox_id: str
    template: str
    info: SessionInfo
    sandbox_live: bool


@get("/sessions")
async def sessions_page(ui: UiDep, session: SessionDep) -> Response[str]:
    """The newest sessions of the key's sandboxes, live or killed."""
    archive = ui.services.activator.agent_archive
    live = ui.services.activator.live
    listed = [
        ListedSession(kept.sandbox_id, kept.sandbox.template, kept.info, kept.sandbox_id in live)
        for kept in (archive.across(session.owner)[:MAX_LISTED_SESSIONS] if archive is not None else [])
    ]
    return page(
        ui, "sessions.html", session=session, active="sessions", sessions=listed, kept=archive is not None,
        limit=MAX_LISTED_SESSIONS,
    )  # fmt: skip


@get("/sessions/{sandbox_id:str}/{session_id:str}")
async def kept_session_page(
    ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath, session_id: SessionIdPath
) -> Response[str]:
    """One kept session's transcript (its newest `MAX_SHOWN_EVENTS` events), read only."""
    archive = _archive(ui)
    sandbox = archive.sandbox(session.owner, sandbox_id)  # 404 page when none is kept, or another key's
    info = archive.info(session.owner, sandbox_id, session_id)
    kept = archive.length(sandbox_id, session_id)
    first = max(0, kept - MAX_SHOWN_EVENTS)
    entries = transcript(
        archive.events(session.owner, sandbox_id, session_id, first, MAX_SHOWN_EVENTS).events, pending=set()
    )
    return page(
        ui, "kept_session.html", session=session, active="sessions", sandbox_id=sandbox_id, sandbox=sandbox,
        info=info, entries=entries, skipped=first, live=False, kept=True,
        sandbox_live=sandbox_id in ui.services.activator.live,
    )  # fmt: skip


def _archive(ui: UiContext) -> AgentArchive:
    archive = ui.services.activator.agent_archive
    if archive is None:
        raise SandboxNotFound("this server keeps no copy of coding-agent sessions (the kubernetes runtime)")
    return archive


KEPT_SESSION_ROUTES = [sessions_page, kept_session_page]
