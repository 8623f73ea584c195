"""The command line: `mcp-gateway --config '<json>'`, as E2B's SDK runs it (as root, with GATEWAY_ACCESS_TOKEN).

    mcp-gateway --config JSON [--host 0.0.0.0] [--port 50005] [--foreground]

It exits 1 with the reason on stderr for a configuration this template cannot serve (before starting
anything), and otherwise once the gateway runs in the background: 0 when it listens, 1 with the tail of
its log when it failed to (a server that did not start, the port taken) within 50 s. The log is
/var/log/mcp-gateway/gateway.log, the token /etc/mcp-gateway/.token (root's, mode 0600, written once the
gateway listens), where the SDK's `get_mcp_token()` reads it after a `connect`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import select
import signal
import socket
import sys
from contextlib import AsyncExitStack
from pathlib import Path

import uvicorn

from executor.mcp_gateway._catalog import BadConfig, servers
from executor.mcp_gateway._gateway import Gateway

__all__ = ("MCP_PORT", "main")

MCP_PORT = 50005
"""E2B's port for the gateway (the SDK's `mcp_port`)."""
TOKEN_FILE = Path("/etc/mcp-gateway/.token")
LOG_FILE = Path("/var/log/mcp-gateway/gateway.log")
START_TIMEOUT = 50.0
"""Seconds the command waits for the servers to start and the gateway to listen (under the 60 s the SDK waits
for the command)."""

logger = logging.getLogger("mcp-gateway")


def main(argv: list[str] | None = None) -> int:
    options = _parse(argv)
    try:
        chosen = servers(json.loads(options.config))
    except json.JSONDecodeError as exc:
        return _fail(f"--config is not JSON: {exc}")
    except BadConfig as exc:
        return _fail(str(exc))
    token = os.environ.get("GATEWAY_ACCESS_TOKEN") or secrets.token_urlsafe(32)
    LOG_FILE.parent.mkdir(parents=True, exist_ok=True)
    gateway = Gateway(chosen, token)
    if options.foreground:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s mcp-gateway %(levelname)s %(message)s")
        _write_token(token)
        return asyncio.run(_serve(gateway, options.host, options.port, ready=None))
    status = _daemon(gateway, options.host, options.port)
    if status == 0:  # only the gateway that listens: a second run that failed leaves the first one's token
        _write_token(token)
    return status


def _write_token(token: str) -> None:
    """`/etc/mcp-gateway/.token`, root's alone, replaced whole."""
    TOKEN_FILE.parent.mkdir(parents=True, exist_ok=True)
    temporary = TOKEN_FILE.with_name(f".token-{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(token)
    temporary.replace(TOKEN_FILE)


def _daemon(gateway: Gateway, host: str, port: int) -> int:
    """Serve in a child of its own session (its output to the log); return once it listens or failed."""
    log_start = LOG_FILE.stat().st_size if LOG_FILE.exists() else 0  # what this run adds is what a failure shows
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the gateway
        os.close(ready_read)
        os.setsid()
        log = os.open(LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        status = 1
        try:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s mcp-gateway %(levelname)s %(message)s")
            status = asyncio.run(_serve(gateway, host, port, ready=ready_write))
        except BaseException:
            logger.exception("the gateway stopped")
        finally:
            os._exit(status)
    os.close(ready_write)
    readable, _, _ = select.select([ready_read], [], [], START_TIMEOUT)
    answer = os.read(ready_read, 1) if readable else b""
    os.close(ready_read)
    if answer == b"1":
        print(f"mcp-gateway: listening on port {port} (pid {pid}), log {LOG_FILE}")
        return 0
    if not readable:
        os.killpg(pid, signal.SIGKILL)  # the gateway leads its session: the servers it started go too
    os.waitpid(pid, 0)
    tail = LOG_FILE.read_bytes()[log_start:].decode(errors="replace").splitlines()[-10:]
    return _fail("the gateway did not start" + "".join(f"\n  {line}" for line in tail))


class _Server(uvicorn.Server):
    """uvicorn's server, which says when it listens (`listening`) or has given up (`serve()` returns)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()


async def _serve(gateway: Gateway, host: str, port: int, ready: int | None) -> int:
    async with AsyncExitStack() as stack:
        await gateway.start(stack)
        server = _Server(
            uvicorn.Config(gateway.app, host=host, port=port, log_level="warning", lifespan="off", interface="asgi3")
        )
        serving = asyncio.create_task(server.serve())
        listening = asyncio.create_task(server.listening.wait())
        await asyncio.wait([serving, listening], return_when=asyncio.FIRST_COMPLETED)
        if not server.listening.is_set():
            listening.cancel()
            return 1  # uvicorn logged why (the port taken, most likely)
        logger.info("listening on %s:%d", host, port)
        if ready is not None:
            os.write(ready, b"1")
            os.close(ready)
        await serving
    return 0


def _fail(message: str) -> int:
    print(f"mcp-gateway: {message}", file=sys.stderr)
    return 1


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="MCP servers behind one endpoint (E2B's)")
    parser.add_argument("--config", required=True, help="JSON: {server name: its settings}, as E2B's mcp=")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    parser.add_argument("--port", type=int, default=MCP_PORT, help=f"port to listen on (default: {MCP_PORT})")
    parser.add_argument("--foreground", action="store_true", help="serve in this process (logs to stderr)")
    return parser.parse_args(argv)
