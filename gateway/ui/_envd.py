"""The envd calls behind the sandbox page (e2b-protocol.md §3): processes, directory listings, downloads, and PTYs.

Every call runs as the sandbox's default user (no `Authorization` header) with the sandbox's access token. Each
call opens its own connection through `open_socket` (the activator's `open_upstream`, which wakes a sandbox the
idle policy paused), except a PTY's input and resizes, which share one kept-alive connection in call order.

EnvdError                the executor refused or failed the call; `status` is the HTTP status the UI answers with
└── PathMissing     404  no such file or directory
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec

from activator import ActivatorError
from pool import ExecutorError, ExecutorRefused, envd

__all__ = ["ENVD_PORT", "Entry", "Envd", "EnvdError", "PathMissing", "ProcessInfo", "Pty"]

ENVD_PORT = 49983
_CALL_DEADLINE = 30.0  # seconds a unary call may take once connected

SocketOpener = Callable[[], Awaitable[Any]]  # () -> a connected socket.socket into the sandbox's envd port


class EnvdError(Exception):
    """The executor refused or failed the call."""

    status_code = 502

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PathMissing(EnvdError):
    """The path does not exist in the sandbox."""

    status_code = 404


class _Message(msgspec.Struct, rename="camel", omit_defaults=True):
    """envd's proto3 JSON: camelCase names, defaults left out, unknown fields ignored."""


class ProcessConfig(_Message):
    cmd: str = ""
    args: list[str] = []
    envs: dict[str, str] = {}
    cwd: str | None = None


class ProcessInfo(_Message):
    """One process started through envd (what `List` answers)."""

    pid: int = 0
    config: ProcessConfig = msgspec.field(default_factory=ProcessConfig)
    tag: str | None = None


class _ListResponse(_Message):
    processes: list[ProcessInfo] = []


class Entry(_Message):
    """One ListDir entry (int64 sizes arrive as strings)."""

    name: str
    path: str
    type: str = "FILE_TYPE_UNSPECIFIED"
    size: str | int = 0
    permissions: str = ""
    modified_time: str | None = None
    symlink_target: str | None = None


class _ListDirResponse(_Message):
    entries: list[Entry] = []


class _PtySize(_Message):
    cols: int
    rows: int


class _Pty(_Message):
    size: _PtySize


class _StartRequest(_Message):
    process: ProcessConfig
    pty: _Pty
    stdin: bool = False


class _Data(_Message):
    pty: bytes | None = None
    stdout: bytes | None = None


class _End(_Message):
    exit_code: int = 0
    status: str = ""


class _Started(_Message):
    pid: int = 0


class _Event(_Message):
    start: _Started | None = None
    data: _Data | None = None
    end: _End | None = None


class _StreamMessage(_Message):
    event: _Event | None = None


_encode = msgspec.json.Encoder().encode
_decode_list = msgspec.json.Decoder(_ListResponse).decode
_decode_dir = msgspec.json.Decoder(_ListDirResponse).decode
_decode_message = msgspec.json.Decoder(_StreamMessage).decode


class Envd:
    """The executor of one sandbox."""

    def __init__(self, open_socket: SocketOpener, *, token: str | None) -> None:
        self._open_socket = open_socket
        self._auth = {"X-Access-Token": token} if token else {}

    async def processes(self) -> list[ProcessInfo]:
        """The processes envd started and still tracks (commands, PTYs, the template's start commands)."""
        return _decode_list(await self._unary("/process.Process/List", {}, "")).processes

    async def list_dir(self, path: str) -> list[Entry]:
        """The entries directly under `path` (relative paths start in the user's home)."""
        raw = await self._unary("/filesystem.Filesystem/ListDir", {"path": path, "depth": 1}, path)
        return _decode_dir(raw).entries

    @asynccontextmanager
    async def download(self, path: str) -> AsyncIterator[envd.Response]:
        """`GET /files` for `path`: the response, its body still to be read (PathMissing, EnvdError)."""
        target = "/files?" + urllib.parse.urlencode({"path": path})
        async with self._connection() as conn:
            response = await _request(conn, "GET", target, self._auth)
            if response.status != 200:
                raise _http_error(response.status, await response.read(4096), path)
            yield response

    @asynccontextmanager
    async def pty(self, cols: int, rows: int) -> AsyncIterator[Pty]:
        """An interactive login shell on a PTY, killed when the block ends."""
        start = _StartRequest(
            process=ProcessConfig(cmd="/bin/bash", args=["-i", "-l"], envs={"TERM": "xterm-256color"}),
            pty=_Pty(size=_PtySize(cols=cols, rows=rows)),
        )
        body = envd.envelope(_encode(start))
        async with self._connection() as conn:
            response = await _request(conn, "POST", "/process.Process/Start", self._auth | envd.STREAM_HEADERS, body)
            if response.status != 200:
                raise _http_error(response.status, await response.read(4096), "")
            events = _events(response)
            pid = await _first_pid(events)
            pty = Pty(pid, events, self._open_socket, self._auth)
            try:
                yield pty
            finally:
                await pty.close()

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[envd.Connection]:
        try:
            conn = await envd.Connection.open(await self._open_socket())
        except ExecutorError as exc:
            raise EnvdError(f"the sandbox's executor is unreachable: {exc}") from exc
        try:
            yield conn
        except ExecutorError as exc:
            raise EnvdError(f"the exchange with the sandbox's executor failed: {exc}") from exc
        finally:
            conn.close()

    async def _unary(self, method: str, request: dict[str, Any], path: str) -> bytes:
        async with self._connection() as conn:
            return await call_unary(conn, method, request, self._auth, path)


class Pty:
    """A running shell on a PTY: its output, and input and resizes on a second, kept-alive connection."""

    def __init__(
        self, pid: int, events: AsyncIterator[_Event], open_socket: SocketOpener, auth: dict[str, str]
    ) -> None:
        self.pid = pid
        self.status = ""  # how the shell ended ("exit status 0"), once `output` has returned
        self._events = events
        self._open_socket = open_socket
        self._auth = auth
        self._input: envd.Connection | None = None  # opened on first use; used by one task (the WebSocket's reader)

    async def output(self) -> AsyncIterator[bytes]:
        """What the shell writes, until it exits."""
        async for event in self._events:
            if event.data is not None and event.data.pty:
                yield event.data.pty
            elif event.end is not None:
                self.status = event.end.status or f"exit code {event.end.exit_code}"
                return

    async def write(self, data: bytes) -> None:
        """Type `data` into the shell."""
        await self._call("/process.Process/SendInput", {"process": {"pid": self.pid}, "input": {"pty": data}})

    async def resize(self, cols: int, rows: int) -> None:
        size = {"cols": cols, "rows": rows}
        await self._call("/process.Process/Update", {"process": {"pid": self.pid}, "pty": {"size": size}})

    async def close(self) -> None:
        """Kill the shell (its PTY session ends with it) and close the input connection; best effort, bounded."""
        # ExecutorError / OSError: the sandbox went away; ActivatorError: it is gone or paused (from `open_socket`).
        with contextlib.suppress(EnvdError, ExecutorError, OSError, TimeoutError, ActivatorError):
            async with asyncio.timeout(5):
                kill = {"process": {"pid": self.pid}, "signal": "SIGNAL_SIGKILL"}
                await self._call("/process.Process/SendSignal", kill)
        if self._input is not None:
            self._input.close()

    async def _call(self, method: str, request: dict[str, Any]) -> None:
        """A unary call on the input connection, reopened once if the previous one broke or was closed."""
        for attempt in (1, 2):
            if self._input is None or not self._input.reusable:
                if self._input is not None:
                    self._input.close()
                self._input = await envd.Connection.open(await self._open_socket())
            try:
                await call_unary(self._input, method, request, self._auth, "")
                return
            except ExecutorError as exc:  # the connection broke (`call_unary` raises refusals as EnvdError)
                self._input.close()
                if attempt == 2:
                    raise EnvdError(f"the sandbox's executor did not take the input: {exc}") from exc


async def call_unary(
    conn: envd.Connection, method: str, request: dict[str, Any], auth: dict[str, str], path: str
) -> bytes:
    """One unary Connect call on `conn`: the response body, or the executor's refusal raised as EnvdError."""
    try:
        async with asyncio.timeout(_CALL_DEADLINE):
            return await envd.call_unary(conn, method, request, auth)
    except ExecutorRefused as exc:
        raise _refused(exc.code, exc.message, path) from exc


async def _request(
    conn: envd.Connection, method: str, target: str, headers: dict[str, str], body: bytes = b""
) -> envd.Response:
    async with asyncio.timeout(_CALL_DEADLINE):
        return await conn.request(method, target, headers, body)


async def _events(response: envd.Response) -> AsyncIterator[_Event]:
    """The events of a server stream, as each envelope completes; an error trailer is raised as EnvdError."""
    async for flags, payload in envd.envelopes(response):
        if flags & envd.END_STREAM:
            error = envd.trailer_error(payload)
            if error is not None:
                raise EnvdError(f"the executor ended the stream: {error.code}: {error.message}")
            return
        message = _decode_message(payload)
        if message.event is not None:
            yield message.event


async def _first_pid(events: AsyncIterator[_Event]) -> int:
    async with asyncio.timeout(_CALL_DEADLINE):
        async for event in events:
            if event.start is not None:
                return event.start.pid
    raise EnvdError("the executor did not report that the shell started")


def _refused(code: str | int, message: str, path: str) -> EnvdError:
    if code in ("not_found", 404):
        return PathMissing(f"{path!r} does not exist in the sandbox")
    return EnvdError(f"the executor refused the call: {code}: {message}")


def _http_error(status: int, raw: bytes, path: str) -> EnvdError:
    if status == 404:
        return PathMissing(f"{path!r} does not exist in the sandbox")
    if not raw.startswith(b"{"):
        return EnvdError(f"the executor answered {status}")
    error = envd.decode_error(raw)
    return _refused(error.code, error.message, path)
