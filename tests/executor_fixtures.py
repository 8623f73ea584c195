"""A running executor for the executor tests, and clients for it.

`envd` is the executor of a real sandbox of the session's server, reached through the gateway with E2B's
routing headers. `direct_envd` / `run_executor()` start `python -m executor` on a free port of this host
(as root, running commands as root: the host has no `user` account) for the tests of its own HTTP
server and process-level behaviour (SIGTERM, limits). Tests talk only over HTTP, through `Envd` (base
URL, token, SDK sandboxes, an httpx client). `workdir` is a fresh directory made through the API. Import
fixtures under their `*_fixture` names.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, ConnectionConfig, Sandbox
from e2b.sandbox.main import SandboxOpts
from packaging.version import Version

from executor.envd import ENVD_VERSION
from tests.server_fixtures import RunningServer

__all__ = (
    "ENVD_VERSION",
    "Envd",
    "direct_envd_fixture",
    "envd_fixture",
    "executor_in_sandbox",
    "run_executor",
    "workdir_fixture",
)

REPOSITORY = Path(__file__).resolve().parent.parent
READY_TIMEOUT = 20.0


@dataclass(frozen=True)
class Envd:
    """How to reach one executor."""

    url: str
    access_token: str | None
    stop: Callable[[], int]
    """Stop the executor (SIGTERM) and return its exit status."""
    sandbox_id: str = "executortest"
    default_user: str = "root"
    """Who commands run as without `user=`: root for a host executor, `user` in a sandbox."""
    home: Path | None = None
    """A host executor's `--home`: the default user's HOME (where its agents read their config), on this host."""

    @property
    def default_home(self) -> str:
        return "/root" if self.default_user == "root" else f"/home/{self.default_user}"

    def routing_headers(self) -> dict[str, str]:
        """What routes a request to this executor on a single-host gateway (signed URLs carry no sandbox)."""
        return {"E2b-Sandbox-Id": self.sandbox_id, "E2b-Sandbox-Port": "49983"}

    def headers(self, **extra: str) -> dict[str, str]:
        """Headers every SDK request to envd carries."""
        base = self.routing_headers()
        if self.access_token is not None:
            base["X-Access-Token"] = self.access_token
        return base | extra

    def client(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers(**headers), timeout=30)

    def sandbox(self) -> Sandbox:
        """The SDK's Sandbox object for this executor (no control plane involved)."""
        return Sandbox(**self._sandbox_options())

    def async_sandbox(self) -> AsyncSandbox:
        return AsyncSandbox(**self._sandbox_options())

    def _sandbox_options(self) -> SandboxOpts:
        config = ConnectionConfig(api_key="e2b_" + "0" * 32, sandbox_url=self.url, extra_sandbox_headers=self.headers())
        return {
            "sandbox_id": self.sandbox_id,
            "sandbox_domain": None,
            "envd_version": Version(ENVD_VERSION),
            "envd_access_token": self.access_token,
            "traffic_access_token": None,
            "connection_config": config,
        }


@contextlib.contextmanager
def run_executor(
    *arguments: str,
    access_token: str | None = "test-token",
    env: dict[str, str] | None = None,
    env_vars: dict[str, str] | None = None,
) -> Iterator[Envd]:
    """Start an executor subprocess (this process's environment, updated by `env`; `env_vars` are the sandbox's,
    as /init gives them), yield its `Envd` once it is ready, stop it afterwards."""
    with tempfile.TemporaryDirectory(prefix="executor-") as scratch:
        init_file = Path(scratch, "init.json")
        init_file.write_text(json.dumps({"accessToken": access_token} | ({"envVars": env_vars} if env_vars else {})))
        log = Path(scratch, "executor.log")
        port = _free_port()
        ready_read, ready_write = os.pipe()
        command = [sys.executable, "-m", "executor", "--host", "127.0.0.1", "--port", str(port)]
        command += ["--ready-fd", str(ready_write), "--default-user", "root", "--init-file", str(init_file)]
        # A home of its own: `bash -l` as the host's root would source the host's ~/.profile (pyenv's rehash takes a
        # lock there that parallel runs wait on), which is neither what a sandbox has nor what is under test.
        home = Path(scratch, "home")
        home.mkdir()
        # The agent port defaults to 2468, which parallel executors on one host would share; an argument wins.
        command += ["--log", str(log), "--home", str(home), "--agent-port", "0", *arguments]
        process = subprocess.Popen(command, cwd=REPOSITORY, pass_fds=(ready_write,), env=os.environ | (env or {}))
        os.close(ready_write)

        def stop() -> int:
            process.terminate()
            return process.wait(timeout=10)

        try:
            _wait_ready(ready_read, process, log)
            yield Envd(f"http://127.0.0.1:{port}", access_token, stop, home=home)
        finally:
            os.close(ready_read)
            stop()
        if "Traceback" in log.read_text():  # an unexpected error inside the executor is a bug
            raise AssertionError(f"the executor logged an unexpected error:\n{log.read_text()}")


def _wait_ready(ready_fd: int, process: subprocess.Popen[bytes], log: Path) -> None:
    readable, _, _ = select.select([ready_fd], [], [], READY_TIMEOUT)
    if not readable or os.read(ready_fd, 16) != b"ready\n":
        process.kill()
        process.wait()
        raise RuntimeError(f"executor did not become ready:\n{log.read_text() if log.exists() else ''}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def executor_in_sandbox(server: RunningServer) -> Iterator[Envd]:
    """The executor of a real sandbox of `server`, reached through its gateway (E2B's single-host routing)."""
    headers = {"X-API-Key": server.api_key}
    created = httpx.post(f"{server.url}/v2/sandboxes", json={"templateID": "base", "timeout": 3600}, headers=headers)
    created.raise_for_status()
    sandbox_id, token = created.json()["sandboxID"], created.json()["envdAccessToken"]

    def stop() -> int:
        return 0 if httpx.delete(f"{server.url}/sandboxes/{sandbox_id}", headers=headers).status_code == 204 else 1

    try:
        yield Envd(server.url, token, stop, sandbox_id, default_user="user")
    finally:
        stop()


@pytest.fixture(name="envd", scope="session")
def envd_fixture(server: RunningServer) -> Iterator[Envd]:
    """An executor inside a real sandbox, over a real connection through the gateway."""
    with executor_in_sandbox(server) as running:
        yield running


@pytest.fixture(name="direct_envd", scope="session")
def direct_envd_fixture() -> Iterator[Envd]:
    """An executor run on this host and reached directly: for tests of its own HTTP server."""
    with run_executor() as running:
        yield running


@pytest.fixture(name="workdir")
def workdir_fixture(envd: Envd) -> Iterator[str]:
    """An empty directory inside the sandbox, made and removed through the API."""
    sandbox = envd.sandbox()
    path = f"/tmp/executor-tests/{uuid.uuid4().hex}"
    sandbox.files.make_dir(path)
    yield path
    sandbox.files.remove(path)
