"""`ui_router`: the whole web UI as one Litestar Router under `/ui`, to add to the control plane's app.

It needs nothing from `app.state`: its collaborators come in `UiServices` and reach the handlers as the `ui`
dependency. Mounted on the control-plane app, it is never reached from a sandbox hostname (the data plane in
front routes those to the sandbox). Order inside, outermost first: `SecurityHeaders` (foreign fetches refused,
headers added), then the handlers, whose `session` / `action_session` dependencies check the cookie, origin and
CSRF token; every error goes through the UI's own handler (a page, or JSON under `/ui/api/`).
"""

from __future__ import annotations

from typing import cast

from litestar import Router
from litestar.datastructures import CacheControlHeader
from litestar.di import Provide
from litestar.static_files import create_static_files_router
from litestar.types import Middleware

from gateway.ui._actions import ACTION_ROUTES
from gateway.ui._agent_sessions import AGENT_SESSION_ROUTES
from gateway.ui._auth import action_session, session
from gateway.ui._context import STATIC_DIR, UiContext
from gateway.ui._errors import error_handler
from gateway.ui._events import EVENT_ROUTES
from gateway.ui._kept_sessions import KEPT_SESSION_ROUTES
from gateway.ui._live_views import LIVE_VIEW_ROUTES, desktop_view
from gateway.ui._login import LOGIN_ROUTES
from gateway.ui._pages import PAGE_ROUTES
from gateway.ui._sandbox_io import IO_ROUTES
from gateway.ui._security import SecurityHeaders
from gateway.ui._services import UiServices
from gateway.ui._sessions import Sessions, SessionStore
from gateway.ui._terminal import terminal

__all__ = ["ui_router"]

ROUTES = [
    *LOGIN_ROUTES,
    *PAGE_ROUTES,
    *EVENT_ROUTES,
    *ACTION_ROUTES,
    *IO_ROUTES,
    *AGENT_SESSION_ROUTES,
    *KEPT_SESSION_ROUTES,
    *LIVE_VIEW_ROUTES,
]
_MAX_BODY = 64 * 1024  # the UI posts small forms only


def ui_router(services: UiServices, *, sessions: Sessions | None = None, refresh: float = 1.0) -> Router:
    """The UI's routes, static files and guards; `sessions`: where sign-ins are kept (this process's memory
    unless given); `refresh`: the seconds between two live snapshots."""
    ui = UiContext(services, sessions if sessions is not None else SessionStore(), refresh=refresh)
    static = create_static_files_router(
        path="/static", directories=[STATIC_DIR], cache_control=CacheControlHeader(no_cache=True), name="ui-static"
    )
    return Router(
        path="/ui",
        route_handlers=[*ROUTES, terminal, desktop_view, static],
        dependencies={
            "ui": Provide(lambda: ui, use_cache=True, sync_to_thread=False),
            "session": Provide(session),
            "action_session": Provide(action_session),
        },
        middleware=[cast("Middleware", SecurityHeaders)],  # plain ASGI; Litestar's scope types are narrower
        exception_handlers={Exception: error_handler(ui)},
        request_max_body_size=_MAX_BODY,
    )
