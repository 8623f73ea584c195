"""The sandbox page's live views: the screen of a desktop sandbox, seen and driven in the page, and the current
page of a browser sandbox (templates with `mcp_tools = ["desktop"]` or `["browser"]`).

The desktop: noVNC's client (vendored in `static/vendor/novnc`, never served from the sandbox: its files would run
with the UI's session) on a WebSocket bridged to an `x11vnc -inetd` in the sandbox, through envd's pipes
(`activator.DESKTOP_VIEW_COMMAND`, which starts the desktop first when nothing did). One VNC server per viewer,
killed when the page leaves; no port is opened in the sandbox, so nothing is reachable past the UI's session.
The handshake, its checks and the reasons are `gateway.ui._process_socket`'s; a failure closes the socket with code
4000 and the reason (noVNC owns the frames).

The browser: `GET .../browser` answers `{url, title, image: {mimeType, data}}` (a PNG of the current page's
viewport, base64, through the DevTools port as MCP's page_screenshot), and `POST .../browser/navigate {url}` loads
another page. Both reach into the sandbox like any request, so they wake one the idle policy paused; the page asks
only while the tab is open.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import WebSocket, get, post, websocket
from litestar.params import JSONBody

from activator import (
    DESKTOP_VIEW_COMMAND,
    SandboxConflict,
    SandboxRecord,
    current_page,
    navigate,
)
from gateway.ui._auth import SessionDep
from gateway.ui._context import SandboxIdPath, UiContext, UiDep
from gateway.ui._process_socket import serve_attached
from gateway.ui._sandbox_io import envd_for, reachable

__all__ = ["LIVE_VIEW_ROUTES", "desktop_view", "live_view"]


class NavigateForm(msgspec.Struct):
    url: Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]


def live_view(ui: UiContext, record: SandboxRecord) -> str | None:
    """Which live view the sandbox's page has: "desktop", "browser", or None."""
    template = ui.services.activator.catalog.templates.get(record.template)
    tools = template.mcp_tools if template is not None else ()
    return next((view for view in ("desktop", "browser") if view in tools), None)


@websocket("/api/sandboxes/{sandbox_id:str}/desktop")
async def desktop_view(socket: WebSocket[Any, Any, Any], ui: UiDep, sandbox_id: SandboxIdPath) -> None:
    await serve_attached(
        socket, ui, sandbox_id,
        lambda record: envd_for(ui, _viewed(ui, record, "desktop")).piped(DESKTOP_VIEW_COMMAND, {"DISPLAY": ":0"}),
        ended=lambda vnc: f"the desktop's VNC server ended ({vnc.status})",
        signed_out="signed out: sign in again to see the desktop", framed=False,
    )  # fmt: skip


@get("/api/sandboxes/{sandbox_id:str}/browser")
async def browser_page(ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath) -> dict[str, Any]:
    """The browser's current page: its URL, title and a PNG of its viewport."""
    record = _viewed(ui, ui.services.activator.get(session.owner, sandbox_id), "browser")
    return await current_page(lambda port: ui.services.activator.open_upstream(record.id, port))


@post("/api/sandboxes/{sandbox_id:str}/browser/navigate", status_code=200)
async def browser_navigate(
    ui: UiDep, action_session: SessionDep, sandbox_id: SandboxIdPath, data: JSONBody[NavigateForm]
) -> dict[str, Any]:
    """Load `url` in the browser's current page and wait for it: `{url, title}`."""
    record = _viewed(ui, ui.services.activator.get(action_session.owner, sandbox_id), "browser")
    return await navigate(lambda port: ui.services.activator.open_upstream(record.id, port), data.url)


def _viewed(ui: UiContext, record: SandboxRecord, view: str) -> SandboxRecord:
    """The sandbox, when it has `view` and may be reached (SandboxConflict otherwise)."""
    if live_view(ui, record) != view:
        raise SandboxConflict(f"sandbox {record.id} has no {view} (template {record.template})")
    return reachable(record)


LIVE_VIEW_ROUTES = [browser_page, browser_navigate]
