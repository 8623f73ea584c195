"""Routing: which handler answers which request, after the access-token check.

    GET|HEAD /health               204
    POST /init                     204 (applies envVars, accessToken, defaultUser, defaultWorkdir)
    GET /envs                      200 the sandbox environment variables
    GET /metrics                   200 CPU / memory / disk
    GET|HEAD|POST /files           download / upload
    POST /process.Process/*        Connect RPCs
    POST /filesystem.Filesystem/*  Connect RPCs
    GET|POST /agent-sandbox/freeze 200 state / 204 after stopping every descendant process (`_freeze`)
    POST /agent-sandbox/thaw       204 after continuing them
    GET|PUT /agent-sandbox/archive the working directory as a tar.gz / restored from one (`_archive`)
    anything else                  404

The RPC services, /files, /metrics, freeze and archive are imported only by `load()`: start-up
time matters more than the first RPC's, so the entry point calls `load()` right after it reports
ready, and the handlers call it too in case a request beats it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from executor._auth import UNAUTHORIZED_MESSAGE, request_allowed
from executor._defaults import Defaults
from executor._errors import ExecutorError, Unimplemented, error_json
from executor._exchange import Request, Response
from executor._reaper import Reaper
from executor.agent_api import AGENT_STATE_DIR
from executor.envd import MAX_ARCHIVE_BYTES, MAX_UPLOAD_BYTES

if TYPE_CHECKING:
    from executor._agents._app import AgentApp
    from executor._archive import Archives
    from executor._as_user import AsUser
    from executor._connect import Rpc
    from executor._files import Files
    from executor._freeze import Freezer
    from executor._metrics import Metrics
    from executor._processes import ProcessTable
    from executor._sudo import SudoServer
    from executor._watch_service import WatchService

__all__ = ("App", "Settings")

JSON = "application/json"
RPC_SERVICES = ("/process.Process/", "/filesystem.Filesystem/")
MAX_INIT_BYTES = 1024 * 1024
STOP_GRACE_SECONDS = 2.0

Route = Callable[[Request, Response], Awaitable[None]]


@dataclass(frozen=True)
class Settings:
    """How this executor runs; decided once by the entry point (what /init may change is `Defaults`)."""

    max_upload_bytes: int = MAX_UPLOAD_BYTES
    max_archive_bytes: int = MAX_ARCHIVE_BYTES
    process_path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    agent_state_dir: str = AGENT_STATE_DIR
    agents_dir: str = "/opt/agents"


@dataclass
class _Loaded:
    rpcs: dict[str, Rpc]
    files: Files
    metrics: Metrics
    processes: ProcessTable
    watches: WatchService
    freezer: Freezer
    archives: Archives
    as_user: AsUser


class App:
    """The executor's request handler."""

    def __init__(self, settings: Settings, defaults: Defaults, reaper: Reaper) -> None:
        self._settings = settings
        self._defaults = defaults
        self._reaper = reaper
        self._loaded: _Loaded | None = None
        self._sudo: SudoServer | None = None
        self._agents: AgentApp | None = None
        self._routes: dict[str, dict[str, Route]] = {
            "/health": {"GET": self._health, "HEAD": self._health},
            "/init": {"POST": self._init},
            "/envs": {"GET": self._envs},
            "/metrics": {"GET": self._metrics},
            "/files": {"GET": self._download, "HEAD": self._download, "POST": self._upload},
            "/agent-sandbox/freeze": {"GET": self._freeze, "POST": self._freeze},
            "/agent-sandbox/thaw": {"POST": self._thaw},
            "/agent-sandbox/archive": {"GET": self._archive, "PUT": self._archive},
        }

    def load(self) -> _Loaded:
        """Import and build everything beyond /health and /init (once)."""
        if self._loaded is None:
            from executor._archive import Archives
            from executor._as_user import AsUser
            from executor._files import Files
            from executor._filesystem_service import FilesystemService
            from executor._freeze import Freezer
            from executor._metrics import Metrics
            from executor._process_service import ProcessService
            from executor._processes import ProcessTable
            from executor._watch_service import WatchService

            processes = ProcessTable(self._reaper)
            as_user = AsUser(self._reaper)
            as_user.prepare(self._defaults.user)
            watches = WatchService(self._defaults, as_user)
            services = {
                "process.Process": ProcessService(processes, self._defaults, self._settings.process_path).methods(),
                "filesystem.Filesystem": FilesystemService(self._defaults, as_user).methods() | watches.methods(),
            }
            rpcs = {f"/{service}/{name}": rpc for service, methods in services.items() for name, rpc in methods.items()}
            files = Files(self._defaults, self._settings.max_upload_bytes, as_user)
            archives = Archives(self._defaults, self._settings.max_archive_bytes)
            self._loaded = _Loaded(rpcs, files, Metrics(), processes, watches, Freezer(), archives, as_user)
        return self._loaded

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reaping children now: as pid 1 the executor adopts orphans from the start."""
        self._reaper.install(loop)

    def serve_sudo(self) -> None:
        """Offer `sudo` to the sandbox's processes (`_sudo`); the entry point calls it only as a sandbox's pid 1."""
        from executor._sudo import SudoServer

        self._sudo = SudoServer(self._defaults, self._reaper)
        self._sudo.start()

    async def close(self) -> None:
        """Kill every process the executor started (and reap them), and stop every watch."""
        if self._sudo is not None:
            self._sudo.close()
        if self._agents is not None:
            await self._agents.close()
        if self._loaded is not None:
            self._loaded.watches.close()
            self._loaded.as_user.close()
            await self._loaded.processes.kill_all(grace=STOP_GRACE_SECONDS)

    async def handle(self, request: Request, response: Response) -> None:
        if not request_allowed(self._defaults, request.method, request.path, request.headers):
            await _error(response, 401, UNAUTHORIZED_MESSAGE)
            return
        methods = self._routes.get(request.path)
        if methods is None and request.path.startswith(RPC_SERVICES):
            methods = {"POST": self._rpc}
        if methods is None:
            await _error(response, 404, f"no such endpoint: {request.path}")
        elif request.method not in methods:
            await _error(response, 405, f"method {request.method} is not allowed on {request.path}")
        else:
            await methods[request.method](request, response)

    async def handle_agents(self, request: Request, response: Response) -> None:
        """A request on the agent port (`executor._agents`), whose server is built on the first one."""
        if self._agents is None:
            import os

            from executor._agents._app import AgentApp

            # 0711: the agent (the default user) opens its catalog file by name; sessions/ and acp/ stay 0700.
            os.makedirs(self._settings.agent_state_dir, mode=0o711, exist_ok=True)
            os.chmod(self._settings.agent_state_dir, 0o711)
            settings, loaded = self._settings, self.load()
            self._agents = AgentApp(
                self._defaults,
                loaded.processes,
                loaded.as_user,
                settings.process_path,
                settings.agent_state_dir,
                settings.agents_dir,
            )
        await self._agents.handle(request, response)

    async def _health(self, request: Request, response: Response) -> None:
        await response.send(204)

    async def _init(self, request: Request, response: Response) -> None:
        from executor._init import apply_init

        try:
            apply_init(self._defaults, await request.body.read(MAX_INIT_BYTES))
        except ExecutorError as exc:
            await _error(response, exc.status, exc.message)
            return
        await response.send(204)

    async def _envs(self, request: Request, response: Response) -> None:
        import json

        await response.send(200, json.dumps(self._defaults.env_vars).encode(), JSON)

    async def _metrics(self, request: Request, response: Response) -> None:
        import json

        await response.send(200, json.dumps(self.load().metrics.snapshot()).encode(), JSON)

    async def _download(self, request: Request, response: Response) -> None:
        await self.load().files.download(request, response)

    async def _upload(self, request: Request, response: Response) -> None:
        await self.load().files.upload(request, response)

    async def _freeze(self, request: Request, response: Response) -> None:
        await self.load().freezer.handle_freeze(request, response)

    async def _thaw(self, request: Request, response: Response) -> None:
        await self.load().freezer.handle_thaw(request, response)

    async def _archive(self, request: Request, response: Response) -> None:
        archives = self.load().archives
        await (archives.download if request.method == "GET" else archives.upload)(request, response)

    async def _rpc(self, request: Request, response: Response) -> None:
        rpc = self.load().rpcs.get(request.path)
        if rpc is None:
            from executor._connect import send_error

            await send_error(response, Unimplemented(f"unknown method {request.path}"), status=404)
            return
        await rpc.serve(request, response)


async def _error(response: Response, status: int, message: str) -> None:
    await response.send(status, error_json(status, message), JSON)
