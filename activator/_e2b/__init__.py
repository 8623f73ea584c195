"""The E2B control plane: Litestar routes, `X-API-Key` auth, E2B's error shape and the OpenAPI document of it all,
assembled by `e2b_router` and `e2b_openapi_config`."""

from __future__ import annotations

from litestar import Router
from litestar.di import Provide
from litestar.middleware import DefineMiddleware

from activator._e2b._agent_session_routes import AGENT_SESSION_ROUTES
from activator._e2b._auth import ApiKeyAuth
from activator._e2b._error_handler import e2b_error_response
from activator._e2b._fork_routes import FORK_ROUTES
from activator._e2b._info_routes import INFO_ROUTES, PUBLIC_INFO_ROUTES
from activator._e2b._lifecycle_routes import LIFECYCLE_ROUTES
from activator._e2b._network_routes import NETWORK_ROUTES
from activator._e2b._openapi import API_KEY_REQUIRED, OPENAPI_PATH, VOLUME_TOKEN_REQUIRED, e2b_openapi_config
from activator._e2b._request import E2bRequest
from activator._e2b._snapshot_routes import SNAPSHOT_ROUTES
from activator._e2b._state import ACTIVATOR, API_KEYS, activator_from, owner_from
from activator._e2b._template_routes import PUBLIC_TEMPLATE_ROUTES, TEMPLATE_ROUTES
from activator._e2b._unsupported_routes import UNSUPPORTED_ROUTES
from activator._e2b._volume_routes import PUBLIC_VOLUME_ROUTES, VOLUME_ROUTES

__all__ = [
    "ACTIVATOR", "API_KEYS", "MAX_BODY_BYTES", "OPENAPI_PATH", "e2b_error_response", "e2b_openapi_config", "e2b_router",
]  # fmt: skip

MAX_BODY_BYTES = 1 << 20  # control-plane bodies are small JSON documents; larger ones get 413


def e2b_router(*, max_body_bytes: int = MAX_BODY_BYTES) -> Router:
    """Every E2B control-plane route with its auth middleware, error handler and request body limit.

    Every route but health, the signed upload URL and the volume content API (its own bearer tokens) sits under
    the inner router, whose middleware checks the `X-API-Key` and whose security requirement says so in the
    OpenAPI document. Handlers find the `Activator` at
    `app.state.activator` and the auth middleware the `ApiKeys` at `app.state.api_keys` (keys `ACTIVATOR`,
    `API_KEYS`); the app's lifespan must set both before serving.
    """
    served = [
        *LIFECYCLE_ROUTES, *NETWORK_ROUTES, *INFO_ROUTES, *TEMPLATE_ROUTES, *SNAPSHOT_ROUTES, *FORK_ROUTES,
        *VOLUME_ROUTES, *AGENT_SESSION_ROUTES,
    ]  # fmt: skip
    volume_content = Router(path="/", route_handlers=PUBLIC_VOLUME_ROUTES, security=VOLUME_TOKEN_REQUIRED)
    keyed = Router(
        path="/",
        route_handlers=[*served, *UNSUPPORTED_ROUTES],
        dependencies={"owner": Provide(owner_from, sync_to_thread=False)},
        middleware=[DefineMiddleware(ApiKeyAuth)],
        security=API_KEY_REQUIRED,
    )
    return Router(
        path="/",
        route_handlers=[*PUBLIC_INFO_ROUTES, *PUBLIC_TEMPLATE_ROUTES, volume_content, keyed],
        dependencies={"activator": Provide(activator_from, sync_to_thread=False)},
        exception_handlers={Exception: e2b_error_response},
        request_max_body_size=max_body_bytes,
        request_class=E2bRequest,
    )
