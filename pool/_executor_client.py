"""The few calls the control plane makes to a sandbox's executor, over a socket the runtime opened.

Each call uses up its socket (`Connection: close`). `freeze`/`thaw` and the archive calls are the executor's own
endpoints (`/agent-sandbox/*`), with which the Kubernetes runtime pauses and snapshots a pod from inside it.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import struct
import urllib.parse

import msgspec

from pool import _envd as envd
from pool._errors import ExecutorError, RuntimeFailure
from pool._runtime import ExecutorInit

__all__ = [
    "EXECUTOR_PORT",
    "download_archive",
    "exchange",
    "freeze",
    "post_init",
    "read_file",
    "start_process",
    "thaw",
    "upload_archive",
]

EXECUTOR_PORT = 49983  # fixed by E2B's envd protocol, in every runtime
_encoder = msgspec.json.Encoder()
_TIMEOUT = 10.0
_ARCHIVE_TIMEOUT = 120.0
"""An archive is up to the executor's --max-archive-bytes (256 MiB) each way, packed or unpacked meanwhile."""


class _Command(msgspec.Struct, kw_only=True):
    cmd: str
    args: list[str]


class _StartRequest(msgspec.Struct, kw_only=True):
    process: _Command
    tag: str
    stdin: bool = False


class _StartEvent(msgspec.Struct):
    pid: int


class _Event(msgspec.Struct):
    start: _StartEvent | None = None


class _Message(msgspec.Struct):
    event: _Event | None = None


_message = msgspec.json.Decoder(_Message)


async def post_init(sock: socket.socket, init: ExecutorInit, current_token: str | None) -> None:
    """Apply env vars, access token and default user to a running executor (envd's `POST /init`)."""
    headers = {"Content-Type": "application/json"}
    status, body = await exchange(sock, "POST", "/init", headers, _encoder.encode(init), current_token)
    if not 200 <= status < 300:
        raise RuntimeFailure(f"executor refused POST /init: {status} {body[:300].decode(errors='replace')}")


async def start_process(sock: socket.socket, command: str, *, tag: str, user: str, token: str | None) -> int:
    """Start `bash -l -c command` as `user` in the background (process.Process/Start); return its pid inside.

    Only the stream's first message (`start{pid}`) is read: closing the stream leaves the process running,
    with no deadline, reachable by its `tag` like any other process of the sandbox.
    """
    message = _encoder.encode(_StartRequest(process=_Command(cmd="/bin/bash", args=["-l", "-c", command]), tag=tag))
    auth = base64.b64encode(f"{user}:".encode()).decode()
    headers = {**envd.STREAM_HEADERS, "Authorization": f"Basic {auth}"}
    status, first = await exchange(
        sock, "POST", "/process.Process/Start", headers, envd.envelope(message), token, first_envelope=True
    )
    event = None
    if status == 200 and first and not first[0] & envd.END_STREAM:
        try:
            event = _message.decode(first[5:]).event
        except msgspec.DecodeError as exc:
            raise RuntimeFailure(f"executor sent a bad start event: {first[:300]!r}") from exc
    if event is None or event.start is None:
        raise RuntimeFailure(f"executor did not start {command!r}: {status} {first[:300].decode(errors='replace')}")
    return event.start.pid


async def read_file(sock: socket.socket, path: str, *, user: str, token: str | None, limit: int) -> bytes | None:
    """A file's content (envd's `GET /files`, `path` relative to `user`'s home), or None when it does not exist.

    RuntimeFailure when the executor refuses, or the file is larger than `limit` bytes (nothing more is read).
    """
    query = urllib.parse.urlencode({"path": path, "username": user})
    status, body = await exchange(sock, "GET", f"/files?{query}", {}, b"", token, limit=limit)
    if status == 404:
        return None
    if status != 200:
        raise RuntimeFailure(f"executor refused GET /files {path}: {status} {body[:300].decode(errors='replace')}")
    return body


async def freeze(sock: socket.socket, token: str | None) -> None:
    """Stop every process of the sandbox but the executor (`POST /agent-sandbox/freeze`); idempotent."""
    await _call(sock, "POST", "/agent-sandbox/freeze", token)


async def thaw(sock: socket.socket, token: str | None) -> None:
    """Continue every process of the sandbox (`POST /agent-sandbox/thaw`); idempotent."""
    await _call(sock, "POST", "/agent-sandbox/thaw", token)


async def download_archive(sock: socket.socket, token: str | None, *, limit: int) -> bytes:
    """The sandbox's working directory as a tar.gz (`GET /agent-sandbox/archive`); RuntimeFailure past `limit` bytes."""
    return await _call(sock, "GET", "/agent-sandbox/archive", token, limit=limit, time_limit=_ARCHIVE_TIMEOUT)


async def upload_archive(sock: socket.socket, token: str | None, archive: bytes) -> None:
    """Unpack a `download_archive` tar.gz into the sandbox's working directory (`PUT /agent-sandbox/archive`)."""
    headers = {"Content-Type": "application/gzip"}
    await _call(sock, "PUT", "/agent-sandbox/archive", token, headers, archive, time_limit=_ARCHIVE_TIMEOUT)


async def _call(
    sock: socket.socket,
    method: str,
    path: str,
    token: str | None,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    *,
    limit: int = 1 << 20,
    time_limit: float = _TIMEOUT,
) -> bytes:
    """The body of a 2xx answer; RuntimeFailure with the status and an excerpt of the body otherwise."""
    status, answer = await exchange(sock, method, path, headers or {}, body, token, limit=limit, time_limit=time_limit)
    if not 200 <= status < 300:
        raise RuntimeFailure(f"executor refused {method} {path}: {status} {answer[:300].decode(errors='replace')}")
    return answer


async def exchange(
    sock: socket.socket,
    method: str,
    target: str,
    headers: dict[str, str],
    body: bytes,
    token: str | None,
    *,
    first_envelope: bool = False,
    limit: int = 1 << 20,
    time_limit: float = _TIMEOUT,
) -> tuple[int, bytes]:
    """One request through the executor client (`pool._envd`), bounded by `time_limit` seconds: its status and its body,
    or only the body's first Connect envelope. RuntimeFailure when the exchange breaks or the body passes `limit`."""
    what = f"{method} {target.split('?', 1)[0]}"
    if token:
        headers = {**headers, "X-Access-Token": token}
    try:
        async with asyncio.timeout(time_limit), envd.exchange(sock, method, target, headers, body) as response:
            if first_envelope and response.status == 200:
                return response.status, await _first_envelope(response)
            return response.status, await response.read(limit)
    except (ExecutorError, TimeoutError) as exc:
        raise RuntimeFailure(f"executor did not answer {what}: {exc!r}") from exc


async def _first_envelope(response: envd.Response) -> bytes:
    async for flags, payload in envd.envelopes(response):
        return struct.pack(">BI", flags, len(payload)) + payload
    return b""
