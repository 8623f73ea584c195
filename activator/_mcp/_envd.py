"""The envd calls the sandbox tools make (e2b-protocol.md §3): run a command, read, write and list files.

Every call goes through `pool.EnvdClient` on a connection of its own from `connect()` (the activator's opener: it
resumes a paused sandbox, like any other request). A command's timeout is sent as `Connect-Timeout-Ms`, so the
executor itself kills the command when it expires and the stream ends with `deadline_exceeded`. What stays here:
the deadlines of the tools' calls, the output caps (`_output`), and the tools' errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec

from activator._mcp._errors import CommandTimedOut, ExecutorFailed, FileMissing, ToolError, executor_failures
from activator._mcp._output import CappedStream
from executor.envd import DataEvent, ListDirRequest
from executor.envd import EntryInfo as Entry
from pool import EnvdClient, ExecutorRefused, SocketOpener, SocketTransport, shell_command

__all__ = ["CommandOutput", "Entry", "Envd", "FileContent"]

_GRACE = 5.0  # seconds the executor gets past a command's timeout to report `deadline_exceeded` itself
_CALL_DEADLINE = 60.0  # seconds any other call may take once connected
_DEADLINE = ExecutorRefused("deadline_exceeded", "")  # what the executor reports when it kills a command in time


class _DeadlinePassed(ExecutorFailed):
    """The exchange with the executor outlived its deadline."""


class CommandOutput(msgspec.Struct, frozen=True):
    """How a foreground command ended, with its output cut to the limits of `_output`."""

    exit_code: int
    stdout: str
    stderr: str


class FileContent(msgspec.Struct, frozen=True):
    """The first bytes of a file and its full size."""

    data: bytes
    size: int


class Envd:
    """The executor of one sandbox, reached through `connect`, acting as `user` with the sandbox's access token."""

    def __init__(self, connect: SocketOpener, *, user: str, token: str | None) -> None:
        self._connect = connect
        self._user = user
        self._token = token

    async def run(self, command: str, *, cwd: str, envs: dict[str, str], kill_after: float) -> CommandOutput:
        """Run `bash -l -c command` to its end; past `kill_after` seconds it is killed (CommandTimedOut)."""
        stdout, stderr = CappedStream("stdout"), CappedStream("stderr")
        request = shell_command(command, cwd=cwd or None, envs=envs)

        def output(data: DataEvent) -> None:
            stdout.add(data.stdout or b"")
            stderr.add(data.stderr or b"")

        try:
            async with self._client(f"running {command!r}", kill_after + _GRACE) as client:
                try:
                    end = await client.run(request, output, kill_after=kill_after)
                except ExecutorRefused as exc:
                    raise _command_failed(command, exc, kill_after, stdout, stderr) from exc
        except _DeadlinePassed as exc:  # the executor did not end it in time: report what it should have reported
            raise _command_failed(command, _DEADLINE, kill_after, stdout, stderr) from exc
        return CommandOutput(exit_code=end.exit_code, stdout=stdout.text(), stderr=stderr.text())

    async def start(self, command: str, *, cwd: str, envs: dict[str, str], kill_after: float | None) -> int:
        """Start `bash -l -c command` and return its pid once it runs; it goes on after the stream is closed."""
        request = shell_command(command, cwd=cwd or None, envs=envs)
        async with self._client(f"starting {command!r}", _CALL_DEADLINE) as client:
            try:
                return await client.start_background(request, kill_after=kill_after)
            except ExecutorRefused as exc:
                raise _command_failed(command, exc, kill_after) from exc

    async def read_file(self, path: str, limit: int) -> FileContent:
        """The first `limit` bytes of the file at `path` (relative paths start in the user's home)."""
        async with self._client(f"GET /files {path}", _CALL_DEADLINE, path) as client, client.read_file(path) as reply:
            data = await reply.prefix(limit)
            size = int(reply.headers.get("content-length", len(data)))
        return FileContent(data=data, size=size)

    async def write_file(self, path: str, data: bytes) -> str:
        """Write `data` to `path`, creating missing directories; returns the absolute path written."""
        async with self._client(f"POST /files {path}", _CALL_DEADLINE, path) as client:
            written = await client.write_file(path, data)
        return written[0].path if written else path

    async def list_dir(self, path: str, depth: int) -> list[Entry]:
        """The entries under `path`, `depth` levels deep."""
        async with self._client("POST /filesystem.Filesystem/ListDir", _CALL_DEADLINE, path) as client:
            return await client.list_dir(ListDirRequest(path=path, depth=depth))

    @asynccontextmanager
    async def _client(self, what: str, deadline: float, path: str | None = None) -> AsyncIterator[EnvdClient]:
        """A client whose exchanges have `deadline` seconds once connected (connecting may resume the sandbox
        first, bounded by the activator); a missing `path` is FileMissing, other errors ExecutorFailed."""
        client = EnvdClient(SocketTransport(self._connect, deadline=deadline), user=self._user, token=self._token)
        try:
            with executor_failures():
                try:
                    yield client
                except ExecutorRefused as exc:
                    if path is None or exc.code not in ("not_found", 404):
                        raise
                    raise FileMissing(f"{path!r} does not exist in the sandbox; list_files shows what does") from exc
        except TimeoutError as exc:
            raise _DeadlinePassed(f"the executor did not finish {what} within {deadline:g} s; retry the call") from exc


def _command_failed(
    command: str,
    error: ExecutorRefused,
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
