"""`serve --metrics-listen HOST:PORT`: `/metrics` on a listener of its own (loopback, say, for a local Prometheus),
and not on the main one.

The listener serves `/metrics` only, with the same `--metrics-auth`. It runs beside the main server in the same
event loop and leaves the signals to it: `serve` stops it once the main server has stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from litestar import Litestar
from litestar.datastructures import State

from activator import e2b_error_response
from gateway._metrics import METRICS_SOURCE, MetricsSource, metrics_route
from gateway._settings import ServeSettings

__all__ = ["metrics_listener"]

_log = logging.getLogger("agent-sandbox")


class _ListenerServer(uvicorn.Server):
    """uvicorn without its signal handlers: the main server's own stop this one (`metrics_listener`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def metrics_listener(settings: ServeSettings, source: MetricsSource) -> AsyncIterator[None]:
    """Serve `/metrics` on `settings.metrics_listen` (nothing when it is None) until the block ends; the address
    is bound before the block starts, so a taken one fails the start."""
    if settings.metrics_listen is None:
        yield
        return
    host, port = settings.metrics_listen
    try:
        listening = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:
        raise SystemExit(f"agent-sandbox: --metrics-listen {host}:{port}: {exc}") from exc
    app = Litestar(
        route_handlers=[metrics_route], state=State({METRICS_SOURCE: source}),
        exception_handlers={Exception: e2b_error_response}, openapi_config=None, logging_config=None,
    )  # fmt: skip
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", lifespan="off", log_level=settings.log_level, access_log=False,
        server_header=False,
    )  # fmt: skip
    server = _ListenerServer(config)
    serving = asyncio.create_task(server.serve(sockets=[listening]))
    _log.info("serving /metrics on http://%s:%d (%s)", host, port, f"--metrics-auth {settings.metrics_auth}")
    try:
        yield
    finally:
        server.should_exit = True
        await serving
        listening.close()
