"""The UI's envd client against a real executor run on this host: unary calls, errors, downloads, and a PTY whose
keystrokes share one kept-alive connection."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.ui._envd import Envd, EnvdError, PathMissing
from tests.executor_fixtures import Envd as RunningExecutor
from tests.executor_fixtures import run_executor

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def executor() -> Iterator[RunningExecutor]:
    with run_executor() as running:
        yield running


class Opener:
    """Connects to the executor the way `open_upstream` hands out sockets, and counts the connections."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.address = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.opened = 0

    async def __call__(self) -> socket.socket:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, self.address)
        self.opened += 1
        return sock


async def test_a_directory_listing_and_a_download(executor: RunningExecutor, tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    envd = Envd(Opener(executor.url), token=executor.access_token)
    entries = await envd.list_dir(str(tmp_path))
    assert sorted((e.name, e.type, int(e.size)) for e in entries if e.type != "FILE_TYPE_DIRECTORY") == [
        ("note.txt", "FILE_TYPE_FILE", 5)
    ]
    async with envd.download(str(tmp_path / "note.txt")) as response:
        assert await response.read() == b"hello"


async def test_missing_paths_and_wrong_tokens_are_told_apart(executor: RunningExecutor, tmp_path: Path) -> None:
    envd = Envd(Opener(executor.url), token=executor.access_token)
    with pytest.raises(PathMissing):
        await envd.list_dir(str(tmp_path / "nope"))
    with pytest.raises(PathMissing):
        async with envd.download(str(tmp_path / "nope")):
            pass
    stranger = Envd(Opener(executor.url), token="not-the-token")
    with pytest.raises(EnvdError, match="unauthorized access") as refused:
        await stranger.processes()
    assert not isinstance(refused.value, PathMissing)


async def test_a_pty_echoes_keystrokes_on_one_connection_and_reports_its_exit(executor: RunningExecutor) -> None:
    opener = Opener(executor.url)
    envd = Envd(opener, token=executor.access_token)
    async with envd.pty(80, 24) as pty:
        assert pty.pid in {p.pid for p in await envd.processes()}
        await pty.resize(100, 40)  # before `exit`: a resize of a shell that has exited is refused
        for key in "echo pty-$((40+2)); exit\r":
            await pty.write(key.encode())
        output = b""
        async with asyncio.timeout(20):
            async for chunk in pty.output():
                output += chunk
    assert b"pty-42" in output
    assert pty.status == "exit status 0"
    assert opener.opened == 3  # the stream, one connection for 26 keystrokes and a resize, and List
