"""The calls the runtimes and warm pools make to a sandbox's executor, each on a socket the runtime opened.

Each call uses up its socket (`Connection: close`), goes through `EnvdClient`, is bounded in time, and turns the
client's errors into RuntimeFailure. `freeze`/`thaw` and the archive calls are the executor's own endpoints
(`/agent-sandbox/*`), with which the Kubernetes runtime pauses and snapshots a pod from inside it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from executor.envd import DataEvent, EndEvent, InitRequest, ProcessInfo
from pool._envd import EnvdClient, SocketTransport, one_socket, shell_command
from pool._errors import ExecutorError, ExecutorRefused, RuntimeFailure
from pool._runtime import ExecutorInit

__all__ = [
    "download_archive",
    "freeze",
    "get",
    "list_processes",
    "post_init",
    "read_file",
    "run_command",
    "start_process",
    "thaw",
    "upload_archive",
    "write_file",
]

_TIMEOUT = 10.0
_ARCHIVE_TIMEOUT = 120.0
"""An archive is up to the executor's `--max-archive-bytes` (`envd.MAX_ARCHIVE_BYTES`) each way, packed or unpacked."""


async def post_init(sock: socket.socket, init: ExecutorInit, current_token: str | None) -> None:
    """Apply env vars, access token and default user to a running executor (envd's `POST /init`)."""
    request = InitRequest(
        env_vars=init.env_vars or None,
        access_token=init.access_token,
        default_user=init.default_user,
        default_workdir=init.default_workdir,
    )
    async with _calling(sock, "POST /init", current_token) as client:
        await client.init(request)


async def start_process(sock: socket.socket, command: str, *, tag: str, user: str, token: str | None) -> int:
    """Start `bash -l -c command` as `user` in the background (process.Process/Start); return its pid inside.

    Only the stream's first message (`start{pid}`) is read: closing the stream leaves the process running,
    with no deadline, reachable by its `tag` like any other process of the sandbox.
    """
    request = shell_command(command, tag=tag)
    async with _calling(sock, f"start {command!r}", token, user=user) as client:
        return await client.start_background(request)


async def run_command(
    sock: socket.socket,
    command: str,
    output: Callable[[DataEvent], None],
    *,
    user: str,
    token: str | None,
    cwd: str | None = None,
    envs: Mapping[str, str] | None = None,
    time_limit: float = _TIMEOUT,
) -> EndEvent:
    """Run `bash -l -c command` as `user` to its end, each chunk of its output passed to `output`; how it ended.

    The executor kills the process after `time_limit` seconds (RuntimeFailure, as for any refusal).
    """
    request = shell_command(command, cwd=cwd, envs=envs)
    async with _calling(sock, f"run {command[:200]!r}", token, user=user, time_limit=time_limit + _TIMEOUT) as client:
        return await client.run(request, output, kill_after=time_limit)


async def write_file(sock: socket.socket, path: str, data: bytes, *, user: str, token: str | None) -> None:
    """Write a file (envd's `POST /files`; missing directories are made), owned by `user`."""
    async with _calling(sock, f"POST /files {path}", token, user=user, time_limit=_ARCHIVE_TIMEOUT) as client:
        await client.write_file(path, data)


async def list_processes(sock: socket.socket, token: str | None) -> list[ProcessInfo]:
    """The processes the executor started and that still run (process.Process/List)."""
    async with _calling(sock, "process.Process/List", token) as client:
        return await client.list_processes()


async def read_file(sock: socket.socket, path: str, *, user: str, token: str | None, limit: int) -> bytes | None:
    """A file's content (envd's `GET /files`, `path` relative to `user`'s home), or None when it does not exist.

    RuntimeFailure when the executor refuses, or the file is larger than `limit` bytes (nothing more is read).
    """
    async with _calling(sock, f"GET /files {path}", token, user=user) as client:
        try:
            async with client.read_file(path) as reply:
                return await reply.read(limit)
        except ExecutorRefused as exc:
            if exc.code == 404:
                return None
            raise


async def get(sock: socket.socket, target: str, token: str | None) -> bytes:
    """The body of the executor's answer to `GET target` (`/metrics`)."""
    async with _calling(sock, f"GET {target}", token) as client:
        return await client.get(target)


async def freeze(sock: socket.socket, token: str | None) -> None:
    """Stop every process of the sandbox but the executor (`POST /agent-sandbox/freeze`); idempotent."""
    async with _calling(sock, "POST /agent-sandbox/freeze", token) as client:
        await client.freeze()


async def thaw(sock: socket.socket, token: str | None) -> None:
    """Continue every process of the sandbox (`POST /agent-sandbox/thaw`); idempotent."""
    async with _calling(sock, "POST /agent-sandbox/thaw", token) as client:
        await client.thaw()


async def download_archive(sock: socket.socket, token: str | None, *, limit: int) -> bytes:
    """The sandbox's working directory as a tar.gz (`GET /agent-sandbox/archive`); RuntimeFailure past `limit` bytes."""
    async with _calling(sock, "GET /agent-sandbox/archive", token, time_limit=_ARCHIVE_TIMEOUT) as client:
        return await client.download_archive(limit=limit)


async def upload_archive(sock: socket.socket, token: str | None, archive: bytes) -> None:
    """Unpack a `download_archive` tar.gz into the sandbox's working directory (`PUT /agent-sandbox/archive`)."""
    async with _calling(sock, "PUT /agent-sandbox/archive", token, time_limit=_ARCHIVE_TIMEOUT) as client:
        await client.upload_archive(archive)


@asynccontextmanager
async def _calling(
    sock: socket.socket, what: str, token: str | None, *, user: str | None = None, time_limit: float = _TIMEOUT
) -> AsyncIterator[EnvdClient]:
    """A client for one call on `sock`, bounded by `time_limit` seconds; its errors raised as RuntimeFailure."""
    try:
        async with asyncio.timeout(time_limit):
            yield EnvdClient(SocketTransport(one_socket(sock)), user=user, token=token)
    except ExecutorRefused as exc:
        raise RuntimeFailure(f"executor refused {what}: {exc.code} {exc.message[:300]}") from exc
    except (ExecutorError, TimeoutError) as exc:
        raise RuntimeFailure(f"executor did not answer {what}: {exc!r}") from exc
