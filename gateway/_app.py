"""The ASGI app: the data plane in front, the control plane (Litestar) behind it."""

from __future__ import annotations

from typing import cast

from litestar import Litestar
from litestar.datastructures import State

from activator import ACTIVATOR, API_KEYS, MAX_BODY_BYTES, e2b_error_response, e2b_router
from gateway._client_watch import ClientWatch
from gateway._dataplane import DataPlane
from gateway._errors_response import ASGIApp
from gateway._metrics import METRICS_SOURCE, MetricsSource, metrics_route
from gateway._platform import Platform
from gateway.ui import SessionStore, SharedSessionStore, UiServices, ui_router

__all__ = ["create_app"]


def create_app(platform: Platform) -> ClientWatch:
    """Assemble the app. Order, outermost first: the client watch (so a request held for a waking sandbox is
    released when its client leaves); the data plane, which routes sandbox hostnames (and E2B's routing
    headers) straight to the proxy, so sandbox traffic never touches the control plane's middleware; then
    Litestar for every other request: the E2B REST API, with its API-key middleware, `/health`, `/metrics`,
    MCP at `/mcp` and the web UI at `/ui`."""
    metrics = MetricsSource(platform.activator, platform.warm_pool_stats)
    ui = UiServices(
        activator=platform.activator, keys=platform.keys, pool_stats=platform.warm_pool_stats,
        last_activity=platform.activator.last_activity,
    )  # fmt: skip
    # Replicas sharing a Redis share the UI's sign-ins too; a replica alone keeps them in memory.
    sessions = SharedSessionStore(platform.redis) if platform.redis is not None else SessionStore()
    ui_routes = ui_router(ui, sessions=sessions)
    control = Litestar(
        route_handlers=[e2b_router(max_body_bytes=MAX_BODY_BYTES), platform.mcp.route(), metrics_route, ui_routes],
        state=State({ACTIVATOR: platform.activator, API_KEYS: platform.keys, METRICS_SOURCE: metrics}),
        exception_handlers={Exception: e2b_error_response},
        openapi_config=None,
        # `serve` configures logging: Litestar's default would log through a queue and a thread, one more
        # format, and lose the last lines when the process ends by its signal.
        logging_config=None,
    )
    app = cast(ASGIApp, control)  # Litestar's precise ASGI types are narrower than the generic ones
    data_plane = DataPlane(app, opener=platform.activator, domain=platform.settings.domain, pool=platform.upstreams)
    return ClientWatch(data_plane)
