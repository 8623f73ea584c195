"""The pages: Sandboxes (list and detail), Templates and Pools. Each is a frame rendered on the server; its live
content arrives over the page's event stream (`_events`) and is drawn by the page's script."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, Response, get
from litestar.exceptions import ValidationException
from litestar.params import FromQuery, QueryParameter
from litestar.response import Redirect

from gateway.ui._auth import SessionDep
from gateway.ui._context import SandboxIdPath, UiContext, UiDep
from gateway.ui._live_views import live_view
from gateway.ui._render import page, sandbox_url_pattern
from gateway.ui._views import own_template_views, pool_views, template_views

__all__ = ["PAGE_ROUTES", "STATE_FILTERS", "parse_metadata"]

STATE_FILTERS = ("running", "paused", "snapshotted")


@get("/")
async def home() -> Redirect:
    return Redirect("/ui/sandboxes", status_code=303)


@get("/sandboxes")
async def sandboxes(
    request: Request[Any, Any, Any],
    ui: UiDep,
    session: SessionDep,
    wanted_state: Annotated[str, QueryParameter(name="state")] = "",
    metadata: FromQuery[str] = "",
) -> Response[str]:
    """Every sandbox of the key, filtered by state and metadata, live."""
    state = wanted_state if wanted_state in STATE_FILTERS else ""
    parse_metadata(metadata)  # a malformed filter is a 400 page here, not a stream that keeps failing
    return page(
        ui, "sandboxes.html", session=session, active="sandboxes", state=state, metadata=metadata,
        states=STATE_FILTERS, url_pattern=_pattern(request, ui),
        api_url=f"{request.url.scheme}://{request.headers.get('host', '')}",
    )  # fmt: skip


@get("/sandboxes/{sandbox_id:str}")
async def sandbox(
    request: Request[Any, Any, Any], ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath
) -> Response[str]:
    """One sandbox: its state and figures, actions, URLs, logs, processes, files, a terminal, its coding-agent
    sessions, and its desktop or browser (`_live_views`) where its template has one."""
    record = ui.services.activator.get(session.owner, sandbox_id)  # 404 page when gone or another key's
    return page(
        ui, "sandbox.html", session=session, active="sandboxes", sandbox_id=record.id,
        url_pattern=_pattern(request, ui), max_timeout=ui.services.activator.settings.max_timeout,
        live_view=live_view(ui, record),
    )  # fmt: skip


@get("/templates")
async def templates(ui: UiDep, session: SessionDep) -> Response[str]:
    """Each template's definition, resources, warm pool target and idle policy; then the key's own templates
    with their builds and logs (the page reloads itself while one is building)."""
    own = own_template_views(ui.services, session.owner)
    building = any(build.status in ("waiting", "building") for view in own for build in view.builds)
    return page(
        ui, "templates.html", session=session, active="templates", templates=template_views(ui.services), own=own,
        building=building,
    )  # fmt: skip


@get("/pools")
async def pools(ui: UiDep, session: SessionDep) -> Response[str]:
    """The warm pools, live (or a note that this server runs none)."""
    enabled = pool_views(ui.services) is not None
    return page(ui, "pools.html", session=session, active="pools", enabled=enabled)


def parse_metadata(text: str) -> dict[str, str]:
    """`key=value` pairs separated by commas or `&` (the E2B API's form); 400 for a pair without `=`."""
    pairs = [pair.strip() for pair in text.replace("&", ",").split(",") if pair.strip()]
    bad = [pair for pair in pairs if "=" not in pair or not pair.partition("=")[0].strip()]
    if bad:
        raise ValidationException(f"metadata filters are key=value pairs, not {', '.join(map(repr, bad))}")
    return {key.strip(): value.strip() for key, _, value in (pair.partition("=") for pair in pairs)}


def _pattern(request: Request[Any, Any, Any], ui: UiContext) -> str:
    return sandbox_url_pattern(request, ui.services.activator.settings.domain or "sandbox.localhost")


PAGE_ROUTES = [home, sandboxes, sandbox, templates, pools]
