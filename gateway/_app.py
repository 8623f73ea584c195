"""The ASGI app: the data plane in front, the control plane (Litestar) behind it."""

from __future__ import annotations

from typing import cast

from litestar import Litestar
from litestar.datastructures import State

from activator import ACTIVATOR, API_KEYS, MAX_BODY_BYTES, e2b_error_response, e2b_router
from gateway._dataplane import DataPlane
from gateway._errors_response import ASGIApp
from gateway._platform import Platform

__all__ = ["create_app"]


def create_app(platform: Platform) -> DataPlane:
    """Assemble the app. Order, outermost first: the data plane routes sandbox hostnames (and E2B's routing
    headers) straight to the proxy, so sandbox traffic never touches the control plane's middleware; every
    other request reaches Litestar: the E2B REST API, with its API-key middleware, and `/health`."""
    control = Litestar(
        route_handlers=[e2b_router(max_body_bytes=MAX_BODY_BYTES)],
        state=State({ACTIVATOR: platform.activator, API_KEYS: platform.keys}),
        exception_handlers={Exception: e2b_error_response},
        openapi_config=None,
    )
    app = cast(ASGIApp, control)  # Litestar's precise ASGI types are narrower than the generic ones
    return DataPlane(app, opener=platform.activator, domain=platform.settings.domain, pool=platform.upstreams)
