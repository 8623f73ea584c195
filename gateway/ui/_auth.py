"""Who is asking: the session behind the cookie, checked on every request, and the checks of state changes.

Pages and read-only endpoints take `session` (the cookie must name a live session); state-changing endpoints
take `action_session`, which also wants the UI's own origin and the session's CSRF token in `X-CSRF-Token`.
A session whose key was revoked ends at its next request: every request asks the key store whether the session's
key is still live (`ApiKeys.active`, answered as the API's own key checks are, so within a second of the
revocation even when `agent-sandbox keys revoke` ran in another process).

SignInRequired   no live session (pages redirect to the sign-in form; the API answers 401)
Forbidden        a state change from another origin or without the CSRF token (403)
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency
from litestar.exceptions import HTTPException

from gateway.ui._context import UiContext, UiDep
from gateway.ui._security import csrf_matches, same_origin
from gateway.ui._sessions import Session

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "Forbidden",
    "SessionDep",
    "SignInRequired",
    "action_session",
    "connection_session",
    "live_session",
    "session",
]

COOKIE = "agent_sandbox_ui"
CSRF_HEADER = "x-csrf-token"


SessionDep = NamedDependency[Session]  # handler parameters `session` and `action_session`


class SignInRequired(HTTPException):
    """The request has no live session."""

    status_code = 401


class Forbidden(HTTPException):
    """A state change that did not come from the UI's own pages."""

    status_code = 403


async def connection_session(connection: ASGIConnection[Any, Any, Any, Any], ui: UiContext) -> Session | None:
    """The live session the request's cookie names, or None."""
    return await live_session(ui, connection.cookies.get(COOKIE))


async def live_session(ui: UiContext, token: str | None) -> Session | None:
    """The live session with this id, or None (also once its key is revoked: revoked keys end their sessions)."""
    found = await ui.sessions.get(token)
    if found is None or await ui.services.keys.active(found.owner):
        return found
    await ui.sessions.drop_owner(found.owner)
    return None


async def session(request: Request[Any, Any, Any], ui: UiDep) -> Session:
    """Dependency: the request's session; SignInRequired without one."""
    found = await connection_session(request, ui)
    if found is None:
        raise SignInRequired("sign in first")
    return found


async def action_session(request: Request[Any, Any, Any], ui: UiDep) -> Session:
    """Dependency for state changes: same origin, a live session, and its CSRF token."""
    if not same_origin(request.headers):
        raise Forbidden("refused: the request did not come from this UI's origin")
    found = await session(request, ui)
    if not csrf_matches(found.csrf, request.headers.get(CSRF_HEADER)):
        raise Forbidden("refused: the CSRF token is missing or wrong; reload the page")
    return found
