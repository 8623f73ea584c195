"""The data plane: the ASGI middleware in front of the control-plane app that proxies sandbox traffic."""

from __future__ import annotations

from activator import Ingress
from executor.envd import ENVD_PORT
from gateway._errors_response import ASGIApp, ErrorReply, Receive, Scope, Send, error_reply, send_error
from gateway._http_proxy import UpstreamConnection, proxy_http
from gateway._routing import Route, Router, RoutingError, host_header
from gateway._traffic import TrafficRefused, admit
from gateway._upstream import UpstreamOpener, UpstreamPool
from gateway._ws_proxy import proxy_websocket, reject_websocket

__all__ = ["DataPlane"]


class DataPlane:
    """Routes HTTP and WebSocket requests for ``<port>-<id>.<domain>`` (or the E2B routing headers) to the sandbox.

    Everything else, and every other scope type (lifespan), reaches ``app`` untouched. Requests to ports but
    envd's first pass the sandbox's ingress rules (``_traffic``). The instance holds only configuration and the
    shared connection pool; per-request state lives in the proxies' locals.
    ``pool.drop(sandbox_id)`` is for the lifecycle layer to call when it pauses or stops a sandbox.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        opener: UpstreamOpener,
        domain: str,
        pool: UpstreamPool[UpstreamConnection] | None = None,
    ) -> None:
        self.app = app
        self.pool: UpstreamPool[UpstreamConnection] = pool if pool is not None else UpstreamPool()
        self._opener = opener
        self._router = Router(domain)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        try:
            route = self._router.parse(host_header(headers), headers)
        except RoutingError as exc:
            await _refuse(scope, send, error_reply(exc, None))
            return
        if route is None:
            await self.app(scope, receive, send)
            return
        try:
            forwarding = admit(await self._ingress(route), route, headers)
        except TrafficRefused as exc:
            await _refuse(scope, send, error_reply(exc, route.sandbox_id))
            return
        self._opener.touch(route.sandbox_id)
        if kind == "http":
            await proxy_http(scope, receive, send, route, self._opener, self.pool, forwarding)
        else:
            await proxy_websocket(scope, receive, send, route, self._opener, forwarding)

    async def _ingress(self, route: Route) -> Ingress | None:
        """The sandbox's ingress rules, which envd's port is exempt from (so its requests skip the lookup)."""
        return None if route.port == ENVD_PORT else await self._opener.ingress(route.sandbox_id)


async def _refuse(scope: Scope, send: Send, reply: ErrorReply) -> None:
    await (send_error(send, reply) if scope["type"] == "http" else reject_websocket(scope, send, reply))
