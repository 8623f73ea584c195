"""HTML responses: pages from the Jinja2 templates (autoescaped), and the URLs they need to build."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.enums import MediaType

from gateway.ui._context import UiContext
from gateway.ui._sessions import Session

__all__ = ["page", "safe_next", "sandbox_url_pattern"]


def page(
    ui: UiContext, name: str, *, session: Session | None, active: str = "", status_code: int = 200, **context: Any
) -> Response[str]:
    """The template `name` rendered in the layout; never cached (it carries the CSRF token)."""
    html = ui.templates.get_template(name).render(session=session, active=active, **context)
    return Response(html, media_type=MediaType.HTML, status_code=status_code, headers={"Cache-Control": "no-store"})


def sandbox_url_pattern(request: Request[Any, Any, Any], domain: str) -> str:
    """`<scheme>://{port}-{id}.<domain>[:<port>]`: where a sandbox port is served, as this browser reaches us.

    The scheme and port are the ones the browser used for the UI (one listener serves both), so the links work
    from wherever the UI was opened; the browser fills in `{port}` and `{id}`.
    """
    host = request.headers.get("host", "")
    after_name = host.partition("]")[2] if host.startswith("[") else host  # [v6]:port
    port = after_name.rpartition(":")[2] if ":" in after_name else ""
    suffix = f":{port}" if port.isdigit() else ""
    scheme = "https" if request.url.scheme in ("https", "wss") else "http"
    return f"{scheme}://{{port}}-{{id}}.{domain}{suffix}"


def safe_next(target: str | None) -> str:
    """Where to go after sign-in: a path of the UI, never another site (`//evil`, `/\\evil`, `https://...`)."""
    if target and target.startswith("/ui/") and not target.startswith(("//", "/\\")) and "\\" not in target:
        return target
    return "/ui/sandboxes"
