"""E2B routes this server does not serve yet, each refused in E2B's shape (501) instead of a bare 404.

The SDK reads a 404 on several of them as something else: "Sandbox <id> not found" for `fork` on a running
sandbox, `False` for a delete. A 501 that names the feature
is an honest answer the SDK raises as it is. The table lists E2B's paths as the SDKs call them (2.63,
e2b-features.md); a route that gets served moves out of it into the module that serves it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from litestar import route
from litestar.handlers import HTTPRouteHandler
from litestar.types import Method

from activator._e2b._openapi import keyed_errors
from activator._errors import NotSupported

__all__ = ["UNSUPPORTED_ROUTES"]

_T = "/templates/{template_id:str}"
_S = "/sandboxes/{sandbox_id:str}"

_UNSUPPORTED: tuple[tuple[Method, tuple[str, ...], str], ...] = (
    ("POST", ("/v2/templates", "/templates", _T), "building templates from a Dockerfile (CLI 1.x; use the SDK)"),
    ("PATCH", (_T, f"/v2{_T}"), "changing templates"),
    ("GET", ("/secrets", "/secrets/{secret_id:str}"), "secrets"),
    ("POST", ("/secrets",), "secrets"),
    ("PATCH", ("/secrets/{secret_id:str}",), "secrets"),
    ("DELETE", ("/secrets/{secret_id:str}",), "secrets"),
)


def _refusal(feature: str) -> Callable[[], Awaitable[None]]:
    async def refuse() -> None:
        raise NotSupported(f"{feature} is not supported by this server")

    return refuse


def _refusing_route(method: Method, paths: tuple[str, ...], feature: str) -> HTTPRouteHandler:
    # Litestar documents a 400 for every route with path parameters; it is E2B's error shape here too.
    statuses = (400, 501) if any("{" in path for path in paths) else (501,)
    return route(
        list(paths), http_method=[method], status_code=501, name=f"unsupported-{method}-{paths[0]}",
        responses=keyed_errors(*statuses), summary=f"Unsupported: {feature}",
        description=f"Refused (501): {feature} is not supported by this server.",
    )(_refusal(feature))  # fmt: skip


UNSUPPORTED_ROUTES: list[HTTPRouteHandler] = [_refusing_route(*row) for row in _UNSUPPORTED]
