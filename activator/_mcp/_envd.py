"""The envd calls the sandbox tools make (e2b-protocol.md §3): run a command, read, write and list files.

Each call opens its own connection through `connect()` (the activator's opener: it resumes a paused sandbox, like
any other request) and sends one HTTP/1.1 request on it. Commands go through `process.Process/Start`, a Connect
server stream of JSON envelopes that is parsed envelope by envelope; their timeout is sent as
`Connect-Timeout-Ms`, so the executor itself kills the command when it expires, and the stream ends with
`deadline_exceeded`.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import NoReturn

import msgspec

from activator._mcp._connect import decode_event, follow, start_body, stream_error
from activator._mcp._errors import CommandTimedOut, ExecutorFailed, FileMissing, ToolError, executor_failures
from activator._mcp._output import CappedStream
from pool import ExecutorRefused, envd

__all__ = ["ENVD_PORT", "CommandOutput", "Entry", "Envd", "FileContent"]

ENVD_PORT = 49983
_GRACE = 5.0  # seconds the executor gets past a command's timeout to report `deadline_exceeded` itself
_CALL_DEADLINE = 60.0  # seconds any other call may take once connected

Connector = Callable[[], Awaitable[socket.socket]]


class _DeadlinePassed(ExecutorFailed):
    """The exchange with the executor outlived its deadline."""


class Entry(msgspec.Struct, rename="camel"):
    """One ListDir entry as envd sends it (proto3 JSON: int64 sizes are strings)."""

    name: str
    path: str
    type: str = "FILE_TYPE_UNSPECIFIED"
    size: str = "0"
    symlink_target: str | None = None


class _ListDirResponse(msgspec.Struct):
    entries: list[Entry] = []


class CommandOutput(msgspec.Struct, frozen=True):
    """How a foreground command ended, with its output cut to the limits of `_output`."""

    exit_code: int
    stdout: str
    stderr: str


class FileContent(msgspec.Struct, frozen=True):
    """The first bytes of a file and its full size."""

    data: bytes
    size: int


_list_dir = msgspec.json.Decoder(_ListDirResponse)
_written = msgspec.json.Decoder(list[Entry])


class Envd:
    """The executor of one sandbox, reached through `connect`, acting as `user` with the sandbox's access token."""

    def __init__(self, connect: Connector, *, user: str, token: str | None) -> None:
        self._connect = connect
        self._headers = {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}
        self._username = user
        if token:
            self._headers["X-Access-Token"] = token

    async def run(self, command: str, *, cwd: str, envs: dict[str, str], kill_after: float) -> CommandOutput:
        """Run `bash -l -c command` to its end; past `kill_after` seconds it is killed (CommandTimedOut)."""
        stdout, stderr = CappedStream("stdout"), CappedStream("stderr")
        try:
            async with self._start(command, cwd, envs, kill_after, deadline=kill_after + _GRACE) as response:
                outcome = await follow(response, stdout, stderr)
        except _DeadlinePassed:  # the executor did not end it in time: report what it should have reported
            outcome = envd.ConnectError("deadline_exceeded")
        if isinstance(outcome, envd.ConnectError):
            raise _command_failed(command, outcome, kill_after, stdout, stderr)
        return CommandOutput(exit_code=outcome.exit_code, stdout=stdout.text(), stderr=stderr.text())

    async def start(self, command: str, *, cwd: str, envs: dict[str, str], kill_after: float | None) -> int:
        """Start `bash -l -c command` and return its pid once it runs; it goes on after the stream is closed."""
        async with self._start(command, cwd, envs, kill_after, deadline=_CALL_DEADLINE) as response:
            async for flags, payload in envd.envelopes(response):
                if flags & envd.END_STREAM:
                    raise _command_failed(command, stream_error(payload), kill_after)
                event = decode_event(payload)
                if event.start is not None:
                    return event.start.pid
        raise ExecutorFailed(f"the executor did not report that {command!r} started")

    async def read_file(self, path: str, limit: int) -> FileContent:
        """The first `limit` bytes of the file at `path` (relative paths start in the user's home)."""
        async with self._request("GET", f"/files?{self._query(path)}") as response:
            if response.status != 200:
                await _raise_http(response, path)
            data = await response.prefix(limit)
            size = int(response.headers.get("content-length", len(data)))
        return FileContent(data=data, size=size)

    async def write_file(self, path: str, data: bytes) -> str:
        """Write `data` to `path`, creating missing directories; returns the absolute path written."""
        headers = {"Content-Type": "application/octet-stream"}
        async with self._request("POST", f"/files?{self._query(path)}", headers, data) as response:
            if response.status != 200:
                await _raise_http(response, path)
            written = _written.decode(await response.read())
        return written[0].path if written else path

    async def list_dir(self, path: str, depth: int) -> list[Entry]:
        """The entries under `path`, `depth` levels deep."""
        request = {"path": path, "depth": depth}
        async with self._connection("POST /filesystem.Filesystem/ListDir", _CALL_DEADLINE) as conn:
            try:
                raw = await envd.call_unary(conn, "/filesystem.Filesystem/ListDir", request, self._headers)
            except ExecutorRefused as exc:
                if exc.code == "not_found":
                    message = f"{path!r} does not exist in the sandbox ({exc.message}); list_files shows what does"
                    raise FileMissing(message) from exc
                raise
        return _list_dir.decode(raw).entries

    def _start(
        self, command: str, cwd: str, envs: dict[str, str], kill_after: float | None, *, deadline: float
    ) -> AbstractAsyncContextManager[envd.Response]:
        headers = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        if kill_after:
            headers["Connect-Timeout-Ms"] = str(max(1, int(kill_after * 1000)))
        body = start_body(command, cwd, envs)
        return self._request("POST", "/process.Process/Start", headers, body, deadline=deadline)

    @asynccontextmanager
    async def _request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None = None,
        body: bytes = b"",
        *,
        deadline: float = _CALL_DEADLINE,
    ) -> AsyncIterator[envd.Response]:
        """One request on a connection of its own (`Connection: close`), within `deadline`."""
        async with self._connection(f"{method} {target.split('?', 1)[0]}", deadline) as conn:
            yield await conn.request(method, target, self._headers | {"Connection": "close"} | (headers or {}), body)

    @asynccontextmanager
    async def _connection(self, what: str, deadline: float) -> AsyncIterator[envd.Connection]:
        """Connect (which may resume the sandbox first, bounded by the activator), then exchange within `deadline`."""
        sock = await self._connect()
        try:
            with executor_failures():
                async with asyncio.timeout(deadline), await envd.Connection.open(sock) as conn:
                    yield conn
        except TimeoutError as exc:
            raise _DeadlinePassed(f"the executor did not finish {what} within {deadline:g} s; retry the call") from exc

    def _query(self, path: str) -> str:
        return urllib.parse.urlencode({"path": path, "username": self._username})


def _command_failed(
    command: str,
    error: envd.ConnectError,
    kill_after: float | None,
    stdout: CappedStream | None = None,
    stderr: CappedStream | None = None,
) -> ToolError:
    """Why a command has no exit status: its timeout (with the output so far), or what the executor said."""
    if error.code != "deadline_exceeded":
        return ExecutorFailed(f"the executor could not run {command!r}: {error.code}: {error.message}")
    message = (
        f"the command {command!r} was still running after its timeout of {kill_after or 0:g} s and was killed. "
        "Pass a larger `timeout`, or start it with `background: true` and check on it later."
    )
    for stream in (stdout, stderr):
        if stream is not None and stream.total:
            message += f"\n{stream.name} so far:\n{stream.text()}"
    return CommandTimedOut(message)


async def _raise_http(response: envd.Response, path: str) -> NoReturn:
    """A /files call failed; envd's JSON error is `{"code": <status>, "message": ...}`."""
    raw = await response.prefix(4096)
    try:
        message = str(msgspec.json.decode(raw, type=dict[str, object]).get("message", ""))
    except msgspec.DecodeError:
        message = raw.decode(errors="replace")
    if response.status == 404:
        raise FileMissing(f"{path!r} does not exist in the sandbox; list_files shows what does")
    raise ExecutorFailed(f"the executor refused the file operation on {path!r}: {response.status} {message}")
