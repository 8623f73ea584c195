"""A real Redis server per test (`redis-server` from Debian, installed by scripts/install-system-packages).

Each test gets its own server on a free port, without persistence, stopped at the end; `stop()` and `start()`
take it down and bring it back on the same port mid-test. Without the binary the tests skip, except under
CI=true, where they fail: CI must prove what they check.
(Bind the fixture in a test module with `redis_server = redis_fixtures.redis_server`.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.server_fixtures import free_port

__all__ = ["REDIS_SERVER", "RedisServer", "redis_server"]

REDIS_SERVER = Path("/usr/bin/redis-server")


class RedisServer:
    """One redis-server process on a fixed port, which a test may stop and start again."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (empty: nothing is saved) and return once it answers PING."""
        assert self._process is None, "already running"
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self._workdir), "--logfile", str(self._workdir / "redis.log")]
        self._process = subprocess.Popen([str(REDIS_SERVER), *args], stdin=subprocess.DEVNULL)
        wait_for(self._answers_or_exited, what=f"redis-server to answer on port {self.port}")
        if self._process.poll() is not None:
            log = (self._workdir / "redis.log").read_text(errors="replace")[-2000:]
            self._process = None
            pytest.fail(f"redis-server on port {self.port} exited:\n{log}")

    def stop(self) -> None:
        """Kill it (SIGKILL: gone at once, like a crash), and wait until it is."""
        if self._process is not None:
            self._process.kill()  # a frozen process dies of SIGKILL too
            self._process.wait(timeout=10)
            self._process = None

    def freeze(self) -> None:
        """Stop it answering without closing its sockets (SIGSTOP), like a hung server; `thaw` resumes it."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def _answers_or_exited(self) -> bool:
        return self._answers() or (self._process is not None and self._process.poll() is not None)

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False


def require_redis_server() -> None:
    if not REDIS_SERVER.exists():
        message = f"{REDIS_SERVER} is missing: run scripts/install-system-packages"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A running redis-server of this test's own; killed at the end."""
    require_redis_server()
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
