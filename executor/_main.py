"""The command line: `python3 -m executor` runs the envd-compatible daemon of a sandbox.

    python3 -m executor [--host 0.0.0.0] [--port ENVD_PORT] [--ready-fd N] [--log PATH]
                        [--default-user user] [--init-file PATH] [--max-upload-bytes N]
                        [--max-archive-bytes N] [--home DIR] [--agent-port AGENT_PORT]
                        [--agent-state-dir DIR] [--agents-dir DIR]

Beside envd's port it serves the coding-agent API (`executor._agents`) on --agent-port.
The launcher waits for `ready` on --ready-fd. SIGTERM (or SIGINT) kills every process the
executor started and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from executor._app import App, Settings
from executor._defaults import Defaults
from executor._http import Connection, listen, stop_on_signals
from executor._reaper import Reaper
from executor.agent_api import AGENT_PORT
from executor.envd import ENVD_PORT

__all__ = ("main",)

logger = logging.getLogger("executor")

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str] | None = None) -> int:
    """Run the executor until SIGTERM; the exit status."""
    options = _parse(argv)
    if options.log:
        _redirect_stdio(options.log)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s executor %(levelname)s %(message)s")
    if os.getpid() != 1:
        _become_subreaper()
    settings = Settings(
        max_upload_bytes=options.max_upload_bytes,
        max_archive_bytes=options.max_archive_bytes,
        process_path=os.environ.get("PATH") or Settings.process_path,
        agent_state_dir=options.agent_state_dir
        or (os.path.join(options.home, ".agent-sandbox") if options.home else Settings.agent_state_dir),
        agents_dir=options.agents_dir,
    )
    if options.home:
        from executor._users import override_home

        override_home(options.home)
    defaults = Defaults(user=options.default_user)
    if options.init_file:
        from executor._errors import ExecutorError
        from executor._init import apply_init

        try:
            with open(options.init_file, "rb") as file:
                apply_init(defaults, file.read())
        except (OSError, ExecutorError) as exc:
            print(f"executor: cannot apply --init-file {options.init_file}: {exc}", file=sys.stderr)
            return 2
    app = App(settings, defaults, Reaper())
    return asyncio.run(_serve(options.host, (options.port, options.agent_port), options.ready_fd, app))


async def _serve(host: str, ports: tuple[int, int], ready_fd: int | None, app: App) -> int:
    loop = asyncio.get_running_loop()
    app.install(loop)
    stop = stop_on_signals(loop)
    try:
        listeners = [listen(host, port, logger) for port in ports]
        if listeners[0] is None or listeners[1] is None:
            return 1
        server = await loop.create_server(lambda: Connection(app.handle), sock=listeners[0])
        agents = await loop.create_server(lambda: Connection(app.handle_agents), sock=listeners[1])
        logger.info(
            "listening on %s:%d (agents on %d)", host, listeners[0].getsockname()[1], listeners[1].getsockname()[1]
        )
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)
        app.load()
        if os.getpid() == 1:  # a sandbox's init: see `_sudo` for why never elsewhere
            app.serve_sudo()
        await stop.wait()
        server.close()
        agents.close()
        await app.close()
        return 0
    finally:
        # Removed while the loop runs: `loop.close()` closes its wakeup pipe before it removes the
        # handlers, and a child dying in between has its SIGCHLD written to a closed fd (a traceback).
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            loop.remove_signal_handler(number)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m executor", description="envd-compatible sandbox daemon")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    parser.add_argument(
        "--port", type=int, default=ENVD_PORT, help=f"port to listen on (default: {ENVD_PORT}; 0 picks one)"
    )
    parser.add_argument(
        "--agent-port",
        type=int,
        default=AGENT_PORT,
        help=f"port of the coding-agent API (default: {AGENT_PORT}; 0 picks one)",
    )
    parser.add_argument(
        "--agent-state-dir",
        help="where agent sessions and their logs are kept (default: /var/lib/agent-sandbox/agents, "
        "or HOME/.agent-sandbox with --home)",
    )
    parser.add_argument(
        "--agents-dir",
        default=Settings.agents_dir,
        help=f"where POST /v1/agents/{{id}}/install puts agents, searched before PATH (default: {Settings.agents_dir})",
    )
    parser.add_argument("--ready-fd", type=int, help="write 'ready\\n' to this fd once listening, then close it")
    parser.add_argument("--log", help="reopen stdin to /dev/null and stdout/stderr to this file (append)")
    parser.add_argument("--default-user", default="user", help="user for requests that name none (default: user)")
    parser.add_argument("--init-file", help="JSON with the fields of POST /init, applied at start-up")
    parser.add_argument("--home", help="every user's home directory instead of /etc/passwd's (the dev cluster's pods)")
    parser.add_argument(
        "--max-upload-bytes",
        type=int,
        default=Settings.max_upload_bytes,
        help="largest accepted POST /files body (default: 1 GiB)",
    )
    parser.add_argument(
        "--max-archive-bytes",
        type=int,
        default=Settings.max_archive_bytes,
        help="largest archive GET or PUT /agent-sandbox/archive handles (default: 256 MiB)",
    )
    return parser.parse_args(argv)


def _redirect_stdio(path: str) -> None:
    """Point fds 0/1/2 at files inside the sandbox (CRIU cannot restore fds on host files)."""
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)


def _become_subreaper() -> None:
    """Not pid 1 (e.g. in tests): adopt orphans anyway, so the Reaper sees them as pid 1 would."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
