"""`agent-sandbox serve`: bootstrap the API key, then run the app under uvicorn until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl
import sys
from types import FrameType

import uvicorn
import uvloop
from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

from gateway._app import create_app
from gateway._client_watch import ClientWatch
from gateway._connection_gate import ConnectionGate
from gateway._fd_reserve import fd_budget, raise_fd_limit
from gateway._guarded_http import GuardedWebSocketProtocol, guarded_protocol
from gateway._key_secret import api_key_from_secret
from gateway._metrics import metrics_source
from gateway._metrics_listener import metrics_listener
from gateway._platform import Platform, open_platform
from gateway._settings import ServeSettings
from pool import KubernetesRuntime, LocalRuntime

__all__ = ["serve"]

_log = logging.getLogger("agent-sandbox")


async def _bootstrap_key(settings: ServeSettings, platform: Platform) -> None:
    """Register AGENT_SANDBOX_API_KEY (or the key in `--api-key-secret`), or on first start create a key, print it
    once and save it."""
    explicit = settings.api_key
    runtime = platform.runtime
    if settings.api_key_secret is not None and isinstance(runtime, KubernetesRuntime):
        explicit = await api_key_from_secret(runtime.api, runtime.settings.namespace, settings.api_key_secret)
    try:
        created = await platform.keys.ensure_bootstrap_key(explicit)
    except ValueError as exc:
        sys.exit(f"agent-sandbox: {exc}")
    if created is None:
        return
    path = settings.data_dir / "api-key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # the mode above applies only to a new file
    with os.fdopen(fd, "w") as f:
        f.write(created + "\n")
    print(f"agent-sandbox: created API key {created} (saved to {path}; it is not shown again)", flush=True)


class _Server(uvicorn.Server):
    """uvicorn, except that the signal that stopped it is raised again only once `serve` has closed the platform.

    uvicorn re-raises it as soon as its own shutdown is over, which ends the process before `open_platform` can
    release the leader lease, stop the warm pools and close the stores.
    """

    stopped_by: int | None = None
    gate: ConnectionGate | None = None  # its refusals are logged every 10 s

    async def on_tick(self, counter: int) -> bool:
        if self.gate is not None and counter % 100 == 0:  # uvicorn ticks every 0.1 s
            self.gate.report()
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.stopped_by = sig
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for connections
        self.should_exit = True


async def _serve(settings: ServeSettings) -> int | None:
    """Serve until a signal; the signal (None if the server stopped on its own)."""
    try:
        budget = fd_budget(settings.connections, raise_fd_limit())
    except ValueError as exc:
        sys.exit(f"agent-sandbox: {exc}")
    gate = ConnectionGate(max_total=budget.max_total, max_per_client=budget.max_per_client)
    async with open_platform(settings) as platform, metrics_listener(settings, metrics_source(platform)):
        await _bootstrap_key(settings, platform)
        server = _Server(_config(settings, create_app(platform), gate))
        server.gate = gate
        _log.info(
            "client connections: at most %d, %s per address; %d of %d file descriptors kept for the server",
            gate.max_total, gate.max_per_client or "no cap", settings.connections.fd_reserve, budget.fd_limit,
        )  # fmt: skip
        _log.info(
            "serving on http://%s:%d (sandboxes at <port>-<id>.%s)", settings.host, settings.port, settings.domain
        )
        await server.serve()  # returns after SIGTERM/SIGINT and a graceful shutdown
    _log.info("stopped: everything the server opened is closed")
    return server.stopped_by


def serve(settings: ServeSettings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # httpx logs every request at INFO: on Kubernetes that is every API call, lease renewals included.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    stopped_by = uvloop.run(_serve(settings))
    if stopped_by is not None:  # end with the conventional status of that signal
        signal.signal(stopped_by, signal.SIG_DFL)
        signal.raise_signal(stopped_by)


async def _cleanup(settings: ServeSettings) -> None:
    async with open_platform(settings) as platform:
        killed = await platform.activator.kill_all()
        if isinstance(platform.runtime, LocalRuntime):  # volumes stay, their filesystems unmounted until used
            await asyncio.to_thread(platform.runtime.volumes.detach_all)
    print(f"agent-sandbox: killed {killed} sandboxes in {settings.data_dir}")


def cleanup(settings: ServeSettings) -> None:
    """Kill every sandbox of `settings.data_dir` (the server must not be running on it); volumes are kept."""
    uvloop.run(_cleanup(settings))


def _config(settings: ServeSettings, app: ClientWatch, gate: ConnectionGate) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=guarded_protocol(settings.connections, gate, _tls(settings)),  # httptools, with the limits and TLS
        ws=GuardedWebSocketProtocol,  # websockets-sansio
        timeout_keep_alive=settings.connections.keep_alive_timeout,
        lifespan="off",  # resources live in `open_platform`, around the server
        log_level=settings.log_level,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=10,
    )


def _tls(settings: ServeSettings) -> ssl.SSLContext | None:
    """The TLS of `--tls-cert`, as uvicorn would make it; the protocol shakes hands (`gateway._guarded_http`)."""
    if settings.tls_cert is None:
        return None
    return create_ssl_context(
        settings.tls_cert, settings.tls_key, None, SSL_PROTOCOL_VERSION, ssl.CERT_NONE, None, None
    )
