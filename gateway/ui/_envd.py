"""The envd calls behind the sandbox page (e2b-protocol.md §3): processes, directory listings, downloads, PTYs, and
processes spoken to over their stdio (the desktop view's VNC server).

Every call goes through `pool.EnvdClient` as the sandbox's default user (no user named) with the sandbox's access
token. Each call opens its own connection through `open_socket` (the activator's `open_upstream`, which wakes a
sandbox the idle policy paused), except an attached process's input (and a PTY's resizes), which share one
kept-alive connection in call order. What stays here: the deadlines of the page's calls, and the errors the UI
answers with.

EnvdError                the executor refused or failed the call; `status` is the HTTP status the UI answers with
└── PathMissing     404  no such file or directory
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from activator import ActivatorError
from executor.envd import EntryInfo as Entry
from executor.envd import (
    ListDirRequest,
    ProcessConfig,
    ProcessEvent,
    ProcessInfo,
    ProcessInput,
    ProcessSelector,
    PtySize,
    SendInputRequest,
    SendSignalRequest,
    StartRequest,
    UpdateRequest,
)
from executor.envd import Pty as PtyRequest
from pool import EnvdClient, ExecutorError, ExecutorRefused, KeptAliveTransport, Reply, SocketOpener, SocketTransport

__all__ = ["AttachedProcess", "Entry", "Envd", "EnvdError", "PathMissing", "ProcessInfo"]

_CALL_DEADLINE = 30.0  # seconds a unary call may take once connected, and a PTY or a download to start


class EnvdError(Exception):
    """The executor refused or failed the call."""

    status_code = 502

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class PathMissing(EnvdError):
    """The path does not exist in the sandbox."""

    status_code = 404


class Envd:
    """The executor of one sandbox."""

    def __init__(self, open_socket: SocketOpener, *, token: str | None) -> None:
        self._open_socket = open_socket
        self._token = token
        self._calls = EnvdClient(SocketTransport(open_socket, deadline=_CALL_DEADLINE), token=token)
        self._streams = EnvdClient(SocketTransport(open_socket), token=token)

    async def processes(self) -> list[ProcessInfo]:
        """The processes envd started and still tracks (commands, PTYs, the template's start commands)."""
        with _translated(""):
            return await self._calls.list_processes()

    async def list_dir(self, path: str) -> list[Entry]:
        """The entries directly under `path` (relative paths start in the user's home)."""
        with _translated(path):
            return await self._calls.list_dir(ListDirRequest(path=path, depth=1))

    @asynccontextmanager
    async def download(self, path: str) -> AsyncIterator[Reply]:
        """`GET /files` for `path`: the response, its body still to be read (PathMissing, EnvdError)."""
        with _translated(path):
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(_CALL_DEADLINE):
                    response = await stack.enter_async_context(self._streams.read_file(path))
                yield response

    @asynccontextmanager
    async def pty(self, cols: int, rows: int) -> AsyncIterator[AttachedProcess]:
        """An interactive login shell on a PTY, killed when the block ends."""
        start = StartRequest(
            process=ProcessConfig(cmd="/bin/bash", args=["-i", "-l"], envs={"TERM": "xterm-256color"}),
            pty=PtyRequest(size=PtySize(cols=cols, rows=rows)),
        )
        async with self._started(start) as pty:
            yield pty

    @asynccontextmanager
    async def piped(self, command: str, envs: dict[str, str]) -> AsyncIterator[AttachedProcess]:
        """`command` (bash) with its stdin and stdout as pipes, byte for byte (stderr is not read): a program that
        speaks a protocol over stdio. Killed when the block ends."""
        start = StartRequest(process=ProcessConfig(cmd="/bin/bash", args=["-c", command], envs=envs), stdin=True)
        async with self._started(start) as piped:
            yield piped

    @asynccontextmanager
    async def _started(self, start: StartRequest) -> AsyncIterator[AttachedProcess]:
        with _translated(""):
            async with contextlib.AsyncExitStack() as stack:
                async with asyncio.timeout(_CALL_DEADLINE):
                    events = await stack.enter_async_context(self._streams.start(start))
                    pid = await _first_pid(events)
                piped = start.pty is None
                process = AttachedProcess(pid, events, KeptAliveTransport(self._open_socket), self._token, piped=piped)
                try:
                    yield process
                finally:
                    await process.close()


class AttachedProcess:
    """A running process on a PTY (a shell) or on pipes (`piped`): its output, and input and resizes on a second,
    kept-alive connection."""

    def __init__(
        self,
        pid: int,
        events: AsyncIterator[ProcessEvent],
        input_transport: KeptAliveTransport,
        token: str | None,
        *,
        piped: bool = False,
    ) -> None:
        self.pid = pid
        self.status = ""  # how the process ended ("exit status 0"), once `output` has returned
        self._events = events
        self._piped = piped
        self._process = ProcessSelector(pid=pid)
        self._transport = input_transport  # connects on first use; used by one task (the WebSocket's reader)
        self._input = EnvdClient(input_transport, token=token)

    async def output(self) -> AsyncIterator[bytes]:
        """What the process writes (on its PTY, or its stdout), until it exits."""
        with _translated(""):
            async for event in self._events:
                data = None if event.data is None else event.data.stdout if self._piped else event.data.pty
                if data:
                    yield data
                elif event.end is not None:
                    self.status = event.end.status or f"exit code {event.end.exit_code}"
                    return

    async def write(self, data: bytes) -> None:
        """Type `data` into the shell, or write it to the process's stdin."""
        given = ProcessInput(stdin=data) if self._piped else ProcessInput(pty=data)
        await self._call(lambda: self._input.send_input(SendInputRequest(self._process, given)))

    async def resize(self, cols: int, rows: int) -> None:
        size = PtySize(cols=cols, rows=rows)
        await self._call(lambda: self._input.update(UpdateRequest(self._process, PtyRequest(size=size))))

    async def close(self) -> None:
        """Kill the shell (its PTY session ends with it) and close the input connection; best effort, bounded."""
        # ExecutorError / OSError: the sandbox went away; ActivatorError: it is gone or paused (from `open_socket`).
        with contextlib.suppress(EnvdError, ExecutorError, OSError, TimeoutError, ActivatorError):
            async with asyncio.timeout(5):
                kill = SendSignalRequest(self._process, "SIGNAL_SIGKILL")
                await self._call(lambda: self._input.send_signal(kill))
        self._transport.close()

    async def _call(self, send: Callable[[], Awaitable[None]]) -> None:
        """A unary call on the input connection, sent again once on a new connection if that one broke (not on
        pipes: bytes that did arrive would arrive twice, and a protocol's stream would go out of step)."""
        attempts = 1 if self._piped else 2
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(_CALL_DEADLINE):
                    await send()
                return
            except ExecutorRefused as exc:
                raise _refused(exc, "") from exc
            except ExecutorError as exc:  # the connection broke; the transport opens a new one for the next call
                if attempt == attempts:
                    raise EnvdError(f"the sandbox's executor did not take the input: {exc}") from exc


async def _first_pid(events: AsyncIterator[ProcessEvent]) -> int:
    async for event in events:
        if event.start is not None:
            return event.start.pid
    raise EnvdError("the executor did not report that the shell started")


@contextmanager
def _translated(path: str) -> Iterator[None]:
    """The client's errors as the UI's: a refusal (PathMissing for a missing `path`), or an unreachable executor."""
    try:
        yield
    except ExecutorRefused as exc:
        raise _refused(exc, path) from exc
    except ExecutorError as exc:
        raise EnvdError(f"the exchange with the sandbox's executor failed: {exc}") from exc


def _refused(exc: ExecutorRefused, path: str) -> EnvdError:
    if exc.code in ("not_found", 404):
        return PathMissing(f"{path!r} does not exist in the sandbox")
    return EnvdError(f"the executor refused the call: {exc.code}: {exc.message}")
