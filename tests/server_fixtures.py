"""`agent-sandbox serve` started as a real subprocess on a free port, for end-to-end tests."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.polling import wait_for

__all__ = [
    "RunningServer", "free_port", "point_e2b_at", "running_server", "server_in_temp_dir", "stop_process",
    "wait_for_port",
]  # fmt: skip

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningServer:
    """A started server: its URL, API key, data directory and process."""

    def __init__(self, process: subprocess.Popen[str], port: int, data_dir: Path, api_key: str, url: str) -> None:
        self.process = process
        self.port = port
        self.url = url
        self.data_dir = data_dir
        self.api_key = api_key

    def e2b_env(self) -> dict[str, str]:
        """The environment an E2B SDK user sets for the plain-HTTP single-host recipe."""
        return {
            "E2B_API_KEY": self.api_key, "E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url,
            "E2B_VOLUME_API_URL": self.url,  # the volume content API: the SDK would go to https://api.<domain>
        }  # fmt: skip

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def stop_process(process: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """SIGTERM a still-running process, and SIGKILL it if it has not exited within `timeout` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def point_e2b_at(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> RunningServer:
    """Point the E2B SDK at `server` (plain-HTTP single-host recipe) for the rest of the test."""
    for name, value in server.e2b_env().items():
        monkeypatch.setenv(name, value)
    return server


def _wait_healthy(url: str, process: subprocess.Popen[str], log: Path, verify: ssl.SSLContext | bool) -> None:
    def healthy() -> bool:
        if process.poll() is not None:
            pytest.fail(f"server exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}")
        try:
            return httpx.get(f"{url}/health", timeout=5, verify=verify).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, what=f"the server at {url} to answer /health", within=180)


@contextmanager
def running_server(
    data_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    scheme: str = "http",
    host: str = "127.0.0.1",
    ca_file: Path | None = None,
    wrap: Sequence[str] = (),
) -> Iterator[RunningServer]:
    """Run `agent-sandbox serve` until the block ends, then SIGTERM it and kill what it left running.

    `wrap`: a command that runs it (`nsenter ... --`: inside a real node's namespace)."""
    port = port or free_port()
    url = f"{scheme}://{host}:{port}"
    environ = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    argv = [*wrap, sys.executable, "-m", "cli", "serve", "--port", str(port), "--data-dir", str(data_dir), *args]
    log_path = data_dir.parent / f"{data_dir.name}.server.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(argv, cwd=REPO, env=environ, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_healthy(url, process, log_path, ssl.create_default_context(cafile=ca_file) if ca_file else True)
        key_file = data_dir / "api-key"
        api_key = environ.get("AGENT_SANDBOX_API_KEY") or key_file.read_text().strip()
        yield RunningServer(process, port, data_dir, api_key, url)
    except BaseException:
        _print_server_log(log_path)  # pytest shows it with the failure: the server's side of what went wrong
        raise
    finally:
        stop_process(process)
        log.close()
        _kill_leftover_sandboxes(data_dir)


def _print_server_log(log_path: Path, lines: int = 60) -> None:
    """The server log's last `lines`, without its access log (`INFO:     127.0.0.1:... "GET ..."`)."""
    kept = [line for line in log_path.read_text(errors="replace").splitlines() if not line.startswith("INFO:  ")]
    print(f"--- the end of {log_path} ---", *kept[-lines:], sep="\n")


def _kill_leftover_sandboxes(data_dir: Path) -> None:
    """Sandboxes outlive a stopped server by design; tests must not leave them behind."""
    subprocess.run([sys.executable, "-m", "cli", "cleanup", "--data-dir", str(data_dir)], cwd=REPO, check=False)


@contextmanager
def server_in_temp_dir(factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[RunningServer]:
    """`running_server(*args)` on a fresh data directory under a temporary directory named after `name`."""
    with running_server(factory.mktemp(name) / "data", *args) as server:
        yield server


def wait_for_port(sandbox: Any, port: int) -> None:
    """Return once something accepts connections on `port` inside the (E2B SDK) sandbox."""
    probe = f"(echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo open || true"
    wait_for(lambda: sandbox.commands.run(probe).stdout == "open\n", what=f"a server on port {port} of the sandbox")
