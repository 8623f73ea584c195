"""The ASGI app: the data plane in front, the control plane (Litestar) behind it."""

from __future__ import annotations

from typing import cast

from litestar import Litestar, Router
from litestar.datastructures import State

from activator import ACTIVATOR, API_KEYS, MAX_BODY_BYTES, e2b_error_response, e2b_openapi_config, e2b_router
from gateway._client_watch import ClientWatch
from gateway._dataplane import DataPlane
from gateway._errors_response import ASGIApp
from gateway._metrics import METRICS_SOURCE, metrics_route, metrics_source
from gateway._platform import Platform
from gateway.ui import SessionStore, SharedSessionStore, UiServices, ui_router

__all__ = ["create_app"]


def create_app(platform: Platform) -> ClientWatch:
    """Assemble the app. Order, outermost first: the client watch (so a request held for a waking sandbox is
    released when its client leaves); the data plane, which routes sandbox hostnames (and E2B's routing
    headers) straight to the proxy, so sandbox traffic never touches the control plane's middleware; then
    Litestar for every other request: the E2B REST API, with its API-key middleware, `/health`, `/metrics`,
    MCP at `/mcp`, the web UI at `/ui`, and the OpenAPI document of the E2B API (only) at `/openapi.json`."""
    metrics = metrics_source(platform)
    here = [] if platform.settings.metrics_listen else [metrics_route]  # else on a listener of its own
    ui = UiServices(
        activator=platform.activator, keys=platform.keys, pool_stats=platform.warm_pool_stats,
        last_activity=platform.activator.last_activity,
    )  # fmt: skip
    # Replicas sharing a Redis share the UI's sign-ins too; a replica alone keeps them in memory.
    sessions = SharedSessionStore(platform.redis) if platform.redis is not None else SessionStore()
    # Not E2B: kept out of the OpenAPI document, which describes the E2B API only.
    ui_routes = ui_router(ui, sessions=sessions)
    not_e2b = Router(path="/", route_handlers=[*here, ui_routes], include_in_schema=False)
    control = Litestar(
        route_handlers=[e2b_router(max_body_bytes=MAX_BODY_BYTES), platform.mcp.route(), not_e2b],
        state=State({ACTIVATOR: platform.activator, API_KEYS: platform.keys, METRICS_SOURCE: metrics}),
        exception_handlers={Exception: e2b_error_response},
        openapi_config=e2b_openapi_config(),
        # `serve` configures logging: Litestar's default would log through a queue and a thread, one more
        # format, and lose the last lines when the process ends by its signal.
        logging_config=None,
    )
    app = cast(ASGIApp, control)  # Litestar's precise ASGI types are narrower than the generic ones
    data_plane = DataPlane(app, opener=platform.activator, domain=platform.settings.domain, pool=platform.upstreams)
    return ClientWatch(data_plane)
