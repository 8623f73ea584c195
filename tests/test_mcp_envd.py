"""The MCP tools' envd client against a real executor run on this host (as root, like `direct_envd`)."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activator._mcp._envd import Envd as EnvdClient
from activator._mcp._errors import CommandTimedOut, ExecutorFailed, FileMissing
from tests.executor_fixtures import Envd, direct_envd_fixture

__all__ = ["direct_envd_fixture"]


@pytest.fixture
def client(direct_envd: Envd) -> EnvdClient:
    port = int(direct_envd.url.rsplit(":", 1)[1])

    async def connect() -> socket.socket:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return sock

    return EnvdClient(connect, user="root", token=direct_envd.access_token)


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="mcp-envd-") as path:
        yield Path(path)


def test_a_command_reports_exit_code_and_both_streams(client: EnvdClient, scratch: Path) -> None:
    command = 'echo "out $GREETING"; pwd; echo err >&2; exit 3'
    result = asyncio.run(client.run(command, cwd=str(scratch), envs={"GREETING": "hi"}, kill_after=30))
    assert (result.exit_code, result.stdout, result.stderr) == (3, f"out hi\n{scratch}\n", "err\n")


def test_a_command_past_its_timeout_is_killed_and_its_output_so_far_reported(client: EnvdClient) -> None:
    started = time.monotonic()
    with pytest.raises(CommandTimedOut) as raised:
        asyncio.run(client.run("echo started; sleep 30", cwd="", envs={}, kill_after=0.5))
    assert time.monotonic() - started < 20  # killed at 0.5 s, not after its 30 s
    assert "timeout of 0.5 s and was killed" in raised.value.message
    assert raised.value.message.endswith("stdout so far:\nstarted\n")


def test_big_output_is_cut_with_a_marker(client: EnvdClient) -> None:
    result = asyncio.run(client.run("head -c 200000 /dev/zero | tr '\\0' a; echo END", cwd="", envs={}, kill_after=30))
    assert "[... 134468 bytes of stdout cut here: at most 65536 bytes per stream" in result.stdout
    assert result.stdout.startswith("a" * 32768 + "\n[... ")
    assert result.stdout.endswith("a" * 32764 + "END\n")


def test_a_background_command_outlives_its_call(client: EnvdClient, scratch: Path) -> None:
    flag = scratch / "flag"
    pid = asyncio.run(client.start(f"sleep 0.3; touch {flag}", cwd="", envs={}, kill_after=None))
    assert pid > 0
    deadline = time.monotonic() + 10
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.exists()


def test_a_missing_working_directory_is_an_executor_error(client: EnvdClient, scratch: Path) -> None:
    with pytest.raises(ExecutorFailed, match=r"invalid_argument: cwd .* does not exist"):
        asyncio.run(client.run("true", cwd=str(scratch / "nope"), envs={}, kill_after=30))


def test_files_are_written_read_and_listed(client: EnvdClient, scratch: Path) -> None:
    target = scratch / "dir" / "hello.txt"
    assert asyncio.run(client.write_file(str(target), b"hello")) == str(target)
    content = asyncio.run(client.read_file(str(target), limit=1024))
    assert (content.data, content.size) == (b"hello", 5)
    entries = asyncio.run(client.list_dir(str(scratch), depth=2))
    assert [(e.path, e.type) for e in entries] == [
        (str(target.parent), "FILE_TYPE_DIRECTORY"),
        (str(target), "FILE_TYPE_FILE"),
    ]


def test_a_read_stops_at_its_limit_and_reports_the_full_size(client: EnvdClient, scratch: Path) -> None:
    (scratch / "big").write_bytes(b"x" * 300_000)
    content = asyncio.run(client.read_file(str(scratch / "big"), limit=1000))
    assert (content.data, content.size) == (b"x" * 1000, 300_000)


def test_a_missing_path_is_reported_as_missing(client: EnvdClient, scratch: Path) -> None:
    missing = str(scratch / "nope")
    with pytest.raises(FileMissing, match="does not exist in the sandbox"):
        asyncio.run(client.read_file(missing, limit=10))
    with pytest.raises(FileMissing, match="does not exist in the sandbox"):
        asyncio.run(client.list_dir(missing, depth=1))
