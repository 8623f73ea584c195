"""Every call of `pool.EnvdClient` against the real executor, one table row per call: which envd method it is, the
request as it goes on the wire (E2B's proto JSON names, written out here), and the answer decoded into the shared
`executor.envd` type. A row fails when the client and the executor stop agreeing: a request field renamed (the
literal wire JSON differs), or an answer carrying something the shared type does not know (decoding it and
encoding it again does not give back what the executor sent)."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import tarfile
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from executor.envd import (
    END_STREAM,
    Empty,
    EndOfStream,
    EntryInfo,
    InitRequest,
    ListDirRequest,
    ListDirResponse,
    ListResponse,
    ProcessConfig,
    ProcessEventResponse,
    ProcessInput,
    ProcessSelector,
    Pty,
    PtySize,
    SendInputRequest,
    SendSignalRequest,
    StartRequest,
    UpdateRequest,
)
from pool import EnvdClient, ExecutorRefused, Reply, SocketTransport, shell_command
from tests.executor_fixtures import Envd, run_executor

pytestmark = pytest.mark.anyio


@dataclass
class Exchange:
    """One request the client sent and the JSON messages of the answer (a stream's envelopes one by one)."""

    path: str
    request: bytes
    status: int = 0
    answer: bytes = b""


class Recording:
    """A `SocketTransport` that keeps every exchange it carried."""

    def __init__(self, inner: SocketTransport) -> None:
        self._inner = inner
        self.exchanges: list[Exchange] = []

    @asynccontextmanager
    async def exchange(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> AsyncIterator[Reply]:
        seen = Exchange(f"{method} {target.split('?', 1)[0]}", body)
        self.exchanges.append(seen)
        async with self._inner.exchange(method, target, headers, body) as reply:
            seen.status = reply.status
            yield _Kept(reply, seen)


class _Kept:
    """A reply whose body is also kept in its `Exchange`."""

    def __init__(self, reply: Reply, seen: Exchange) -> None:
        self._reply, self._seen = reply, seen
        self.status, self.headers = reply.status, reply.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._reply.chunks():
            self._seen.answer += chunk
            yield chunk

    async def read(self, limit: int = 16 << 20) -> bytes:
        body = b"".join([chunk async for chunk in self.chunks()])
        assert len(body) <= limit
        return body

    async def prefix(self, limit: int) -> bytes:
        return (await self.read())[:limit]


@dataclass
class Context:
    """What a row's call leaves for its expectations: the scratch directory and the pid it worked on."""

    scratch: Path
    pid: int = 0
    result: Any = None


@dataclass(frozen=True)
class Row:
    method: str  # as recorded: "POST /process.Process/Start"
    call: Callable[[EnvdClient, Context], Awaitable[Any]]
    request: Callable[[Context], object]  # the JSON request on the wire; None: not JSON
    answer: Any  # the shared type of each answer message; None: not JSON
    check: Callable[[Context], bool] = lambda ctx: True
    streamed: bool = False


async def _write(client: EnvdClient, ctx: Context) -> list[EntryInfo]:
    return await client.write_file(str(ctx.scratch / "a.txt"), b"hello")


async def _write_many(client: EnvdClient, ctx: Context) -> list[EntryInfo]:
    return await client.write_files({str(ctx.scratch / "b.txt"): b"bb", str(ctx.scratch / "c.txt"): b"c"})


async def _read(client: EnvdClient, ctx: Context) -> bytes:
    (ctx.scratch / "r.txt").write_bytes(b"read me")
    async with client.read_file(str(ctx.scratch / "r.txt")) as reply:
        return await reply.read()


async def _list_dir(client: EnvdClient, ctx: Context) -> list[EntryInfo]:
    (ctx.scratch / "d.txt").write_bytes(b"1234")
    return await client.list_dir(ListDirRequest(path=str(ctx.scratch), depth=1))


async def _list_dir_metadata(client: EnvdClient, ctx: Context) -> list[EntryInfo]:
    (ctx.scratch / "m.txt").write_bytes(b"m")
    os.setxattr(ctx.scratch / "m.txt", "user.e2b.owner", b"alice")
    return await client.list_dir(ListDirRequest(path=str(ctx.scratch), depth=1))


async def _run(client: EnvdClient, ctx: Context) -> tuple[int, bytes]:
    out: list[bytes] = []
    end = await client.run(
        shell_command("echo out; echo err >&2; exit 3"), lambda d: out.append(d.stdout or d.stderr or b"")
    )
    return end.exit_code, b"".join(out)


async def _start_tagged(client: EnvdClient, ctx: Context) -> int:
    ctx.pid = await client.start_background(shell_command("sleep 30", tag="roundtrip", envs={"A": "1"}))
    return ctx.pid


async def _list(client: EnvdClient, ctx: Context) -> list[Any]:
    ctx.pid = await client.start_background(shell_command("sleep 30", tag="listed"))
    listed = await client.list_processes()
    await client.send_signal(SendSignalRequest(ProcessSelector(pid=ctx.pid), "SIGNAL_SIGKILL"))
    return [(p.pid, p.tag, p.config.cmd) for p in listed]


async def _signal(client: EnvdClient, ctx: Context) -> None:
    ctx.pid = await client.start_background(shell_command("sleep 30", tag="signalled"))
    await client.send_signal(SendSignalRequest(ProcessSelector(tag="signalled"), "SIGNAL_SIGKILL"))


async def _on_pty(client: EnvdClient, ctx: Context, call: Callable[[int], Awaitable[None]]) -> None:
    """Run `call` with the pid of a `cat` on a PTY, killed afterwards."""
    start = StartRequest(process=ProcessConfig(cmd="/bin/cat"), pty=Pty(size=PtySize(cols=80, rows=24)))
    async with client.start(start) as events:
        async for event in events:
            if event.start is not None:
                ctx.pid = event.start.pid
                break
        try:
            await call(ctx.pid)
        finally:
            await client.send_signal(SendSignalRequest(ProcessSelector(pid=ctx.pid), "SIGNAL_SIGKILL"))


async def _input(client: EnvdClient, ctx: Context) -> None:
    await _on_pty(
        client,
        ctx,
        lambda pid: client.send_input(SendInputRequest(ProcessSelector(pid=pid), ProcessInput(pty=b"hi\n"))),
    )


async def _resize(client: EnvdClient, ctx: Context) -> None:
    size = Pty(size=PtySize(cols=100, rows=40))
    await _on_pty(client, ctx, lambda pid: client.update(UpdateRequest(ProcessSelector(pid=pid), size)))


async def _init(client: EnvdClient, ctx: Context) -> None:
    await client.init(InitRequest(env_vars={"ROUNDTRIP": "1"}, default_workdir=str(ctx.scratch)))


async def _download(client: EnvdClient, ctx: Context) -> list[str]:
    await client.init(InitRequest(default_workdir=str(ctx.scratch)))
    (ctx.scratch / "kept.txt").write_text("kept")
    with tarfile.open(fileobj=io.BytesIO(await client.download_archive(limit=1 << 20)), mode="r:gz") as tar:
        return tar.getnames()


async def _download_xattrs(client: EnvdClient, ctx: Context) -> dict[str, str]:
    await client.init(InitRequest(default_workdir=str(ctx.scratch)))
    (ctx.scratch / "tagged.txt").write_text("tagged")
    os.setxattr(ctx.scratch / "tagged.txt", "user.e2b.owner", b"alice")
    with tarfile.open(fileobj=io.BytesIO(await client.download_archive(limit=1 << 20)), mode="r:gz") as tar:
        return dict(tar.getmember("tagged.txt").pax_headers)


async def _upload(client: EnvdClient, ctx: Context) -> bool:
    await client.init(InitRequest(default_workdir=str(ctx.scratch)))
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        info = tarfile.TarInfo("restored.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"back"))
    await client.upload_archive(packed.getvalue())
    return (ctx.scratch / "restored.txt").read_text() == "back"


async def _freeze_thaw(client: EnvdClient, ctx: Context) -> None:
    await client.freeze()
    await client.thaw()


def _bash(command: str, envs: dict[str, str] | None = None, tag: str | None = None) -> dict[str, object]:
    """`shell_command`'s request as E2B's proto JSON names it."""
    process: dict[str, object] = {"cmd": "/bin/bash", "args": ["-l", "-c", command]} | ({"envs": envs} if envs else {})
    return {"process": process} | ({"tag": tag} if tag else {}) | {"stdin": False}


def _names(ctx: Context) -> list[tuple[str, str]]:
    return sorted((e.name, e.path.removeprefix(str(ctx.scratch))) for e in ctx.result)


NO_JSON: Callable[[Context], object] = lambda ctx: None  # noqa: E731
RUN = "echo out; echo err >&2; exit 3"
_FILE = "FILE_TYPE_FILE"

ROWS = {
    "init": Row(
        "POST /init", _init, lambda ctx: {"envVars": {"ROUNDTRIP": "1"}, "defaultWorkdir": str(ctx.scratch)}, None
    ),
    "write one file": Row(
        "POST /files", _write, NO_JSON, list[EntryInfo], lambda ctx: _names(ctx) == [("a.txt", "/a.txt")]
    ),
    "write files (multipart)": Row(
        "POST /files", _write_many, NO_JSON, list[EntryInfo],
        lambda ctx: _names(ctx) == [("b.txt", "/b.txt"), ("c.txt", "/c.txt")],
    ),
    "read a file": Row("GET /files", _read, NO_JSON, None, lambda ctx: ctx.result == b"read me"),
    "list a directory": Row(
        "POST /filesystem.Filesystem/ListDir", _list_dir, lambda ctx: {"path": str(ctx.scratch), "depth": 1},
        ListDirResponse, lambda ctx: [(e.name, e.size, e.type) for e in ctx.result] == [("d.txt", "4", _FILE)],
    ),
    "list a directory with file metadata": Row(
        "POST /filesystem.Filesystem/ListDir", _list_dir_metadata, lambda ctx: {"path": str(ctx.scratch), "depth": 1},
        ListDirResponse, lambda ctx: [(e.name, e.metadata) for e in ctx.result] == [("m.txt", {"owner": "alice"})],
    ),
    "run to the end": Row(
        "POST /process.Process/Start", _run, lambda ctx: _bash(RUN), ProcessEventResponse,
        lambda ctx: ctx.result[0] == 3 and sorted(ctx.result[1].splitlines()) == [b"err", b"out"], streamed=True,
    ),
    "start in the background": Row(
        "POST /process.Process/Start", _start_tagged,
        lambda ctx: _bash("sleep 30", {"A": "1"}, "roundtrip"),
        ProcessEventResponse, lambda ctx: ctx.result == ctx.pid > 0, streamed=True,
    ),
    "list processes": Row(
        "POST /process.Process/List", _list, lambda ctx: {}, ListResponse,
        lambda ctx: (ctx.pid, "listed", "/bin/bash") in ctx.result,
    ),
    "send a signal": Row(
        "POST /process.Process/SendSignal", _signal,
        lambda ctx: {"process": {"tag": "signalled"}, "signal": "SIGNAL_SIGKILL"}, Empty,
    ),
    "send input": Row(
        "POST /process.Process/SendInput", _input,
        lambda ctx: {"process": {"pid": ctx.pid}, "input": {"pty": "aGkK"}}, Empty,  # base64 of b"hi\n"
    ),
    "resize a pty": Row(
        "POST /process.Process/Update", _resize,
        lambda ctx: {"process": {"pid": ctx.pid}, "pty": {"size": {"cols": 100, "rows": 40}}}, Empty,
    ),
    "download the archive": Row(
        "GET /agent-sandbox/archive", _download, NO_JSON, None, lambda ctx: "kept.txt" in ctx.result
    ),
    "download the archive with xattrs": Row(
        "GET /agent-sandbox/archive", _download_xattrs, NO_JSON, None,
        lambda ctx: ctx.result["SCHILY.xattr.user.e2b.owner"] == "alice",
    ),
    "upload an archive": Row("PUT /agent-sandbox/archive", _upload, NO_JSON, None, lambda ctx: ctx.result),
    "freeze": Row("POST /agent-sandbox/freeze", _freeze_thaw, NO_JSON, None),
    "thaw": Row("POST /agent-sandbox/thaw", _freeze_thaw, NO_JSON, None),
}  # fmt: skip


@pytest.fixture(scope="module")
def executor() -> Iterator[Envd]:
    with run_executor() as running:
        yield running


def _client(executor: Envd) -> tuple[EnvdClient, Recording]:
    address = urllib.parse.urlsplit(executor.url)

    async def connect() -> socket.socket:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (address.hostname, address.port))
        return sock

    recording = Recording(SocketTransport(connect))
    return EnvdClient(recording, user="root", token=executor.access_token), recording


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_the_client_and_the_executor_agree_on(row: Row, executor: Envd, tmp_path: Path) -> None:
    client, recording = _client(executor)
    ctx = Context(tmp_path)
    ctx.result = await row.call(client, ctx)
    (seen,) = [exchange for exchange in recording.exchanges if exchange.path == row.method]
    assert 200 <= seen.status < 300
    expected = row.request(ctx)
    if expected is not None:
        payload = seen.request[5:] if row.streamed else seen.request
        assert msgspec.json.decode(payload) == expected
    for message in _answers(seen, row):
        decoded = msgspec.json.decode(message, type=row.answer)
        assert msgspec.json.decode(msgspec.json.encode(decoded)) == msgspec.json.decode(message)
    assert row.check(ctx)


def _answers(seen: Exchange, row: Row) -> list[bytes]:
    """The answer's JSON messages: every envelope of a stream but its trailer (which must be clean), or the body."""
    if row.answer is None:
        return []
    if not row.streamed:
        return [seen.answer]
    messages, buffer = [], seen.answer
    while buffer:
        flags, size = buffer[0], int.from_bytes(buffer[1:5], "big")
        payload, buffer = buffer[5 : 5 + size], buffer[5 + size :]
        if flags & END_STREAM:
            assert msgspec.json.decode(payload, type=EndOfStream) == EndOfStream()
        else:
            messages.append(payload)
    assert messages
    return messages


async def test_a_refusal_carries_the_executors_connect_code(executor: Envd, tmp_path: Path) -> None:
    client, _ = _client(executor)
    with pytest.raises(ExecutorRefused) as refused:
        await client.list_dir(ListDirRequest(path=str(tmp_path / "missing")))
    assert refused.value.code == "not_found"
    with pytest.raises(ExecutorRefused) as missing:
        async with client.read_file(str(tmp_path / "missing")):
            pass
    assert missing.value.code == 404
