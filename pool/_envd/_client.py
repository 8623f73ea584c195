"""The one typed client of a sandbox's executor (E2B's envd, plus the executor's own `/agent-sandbox/*` calls).

Requests and answers are `executor.envd`'s Structs, the ones the executor itself decodes and encodes, so client
and server cannot drift apart unnoticed (`tests/test_envd_wire_roundtrip.py` round-trips every call). What the
client adds to each call: envd's headers (the access token; the user as Basic auth on Connect calls, as
`?username=` on /files), the Connect content types, envelopes, and a typed answer. What it leaves to its callers:
deadlines (`asyncio.timeout` around a call; a command's own timeout is sent as `Connect-Timeout-Ms`), output
limits, and translating errors into their own.

The transport is injected (`EnvdTransport`): a socket into the sandbox for the gateway, the tools and the
runtimes, httpx through the gateway for `agent-sandbox deploy`.

ExecutorError            the exchange broke, or the answer is not what envd sends (from the transport or here)
└── ExecutorRefused      the executor answered with an error: `code` is Connect's ("not_found", "deadline_exceeded",
                         ...) for RPCs and stream trailers, the HTTP status for /files, /init and /agent-sandbox/*
"""

from __future__ import annotations

import secrets
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

import msgspec

from executor.envd import (
    ACCESS_TOKEN_HEADER,
    END_STREAM,
    PROTOCOL_HEADERS,
    STREAM_TYPE,
    TIMEOUT_HEADER,
    UNARY_TYPE,
    USER_HEADER,
    DataEvent,
    Empty,
    EndEvent,
    EntryInfo,
    InitRequest,
    ListDirRequest,
    ListDirResponse,
    ListResponse,
    Message,
    ProcessConfig,
    ProcessEvent,
    ProcessEventResponse,
    ProcessInfo,
    SendInputRequest,
    SendSignalRequest,
    StartRequest,
    UpdateRequest,
    basic_auth,
    encode,
    envelope,
)
from pool._envd._connect import envelopes, refused, trailer_error
from pool._envd._transport import EnvdTransport, Reply
from pool._errors import ExecutorError, ExecutorRefused

__all__ = ["EnvdClient", "shell_command"]

T = TypeVar("T")

_UNARY_HEADERS = {"Content-Type": UNARY_TYPE, **PROTOCOL_HEADERS}
_STREAM_HEADERS = {"Content-Type": STREAM_TYPE, **PROTOCOL_HEADERS}
_EMPTY = msgspec.json.Decoder(Empty)
_LIST = msgspec.json.Decoder(ListResponse)
_LIST_DIR = msgspec.json.Decoder(ListDirResponse)
_WRITTEN = msgspec.json.Decoder(list[EntryInfo])
_EVENT = msgspec.json.Decoder(ProcessEventResponse)


class EnvdClient:
    """The executor of one sandbox, through `transport`, as `user` (None: the sandbox's default user) with the
    sandbox's access `token` (None: the executor has none)."""

    def __init__(self, transport: EnvdTransport, *, user: str | None = None, token: str | None = None) -> None:
        self._transport = transport
        self._user = user
        self._token = {ACCESS_TOKEN_HEADER: token} if token else {}
        self._rpc = self._token | ({USER_HEADER: basic_auth(user)} if user is not None else {})

    # process.Process

    async def list_processes(self) -> list[ProcessInfo]:
        """The processes the executor started and still tracks (`List`)."""
        return (await self._unary("process.Process/List", Empty(), _LIST)).processes

    @asynccontextmanager
    async def start(
        self, request: StartRequest, *, kill_after: float | None = None
    ) -> AsyncIterator[AsyncIterator[ProcessEvent]]:
        """Start a process (`Start`) and yield its events (start, data, end; keepalives left out) as they come.

        An error trailer is raised as ExecutorRefused (`deadline_exceeded` once `kill_after` seconds have passed:
        the executor killed the process; sent as `Connect-Timeout-Ms`). Leaving the block closes the stream;
        the process goes on (a PTY's shell too, until killed).
        """
        headers = _STREAM_HEADERS | self._rpc
        if kill_after:
            headers |= {TIMEOUT_HEADER: str(max(1, int(kill_after * 1000)))}
        async with self._exchange("POST", "/process.Process/Start", headers, envelope(encode(request))) as reply:
            if reply.status != 200:
                raise await refused(reply)
            events = _events(reply)
            try:
                yield events
            finally:
                await events.aclose()

    async def start_background(self, request: StartRequest, *, kill_after: float | None = None) -> int:
        """Start a process and return its pid once it runs; it goes on after the stream is closed (until
        `kill_after` seconds have passed, when set)."""
        async with self.start(request, kill_after=kill_after) as events:
            async for event in events:
                if event.start is not None:
                    return event.start.pid
        raise ExecutorError("the executor did not report that the process started")

    async def run(
        self, request: StartRequest, output: Callable[[DataEvent], None], *, kill_after: float | None = None
    ) -> EndEvent:
        """Run a process to its end, passing each chunk of its output to `output`; how it ended."""
        async with self.start(request, kill_after=kill_after) as events:
            async for event in events:
                if event.data is not None:
                    output(event.data)
                if event.end is not None:
                    return event.end
        raise ExecutorError("the executor stopped reporting the process before it ended")

    async def send_signal(self, request: SendSignalRequest) -> None:
        await self._unary("process.Process/SendSignal", request, _EMPTY)

    async def send_input(self, request: SendInputRequest) -> None:
        await self._unary("process.Process/SendInput", request, _EMPTY)

    async def update(self, request: UpdateRequest) -> None:
        """Resize a process's PTY."""
        await self._unary("process.Process/Update", request, _EMPTY)

    # filesystem.Filesystem

    async def list_dir(self, request: ListDirRequest) -> list[EntryInfo]:
        """The entries under `request.path` (relative paths start in the user's home), `depth` levels deep."""
        return (await self._unary("filesystem.Filesystem/ListDir", request, _LIST_DIR)).entries

    # /files

    @asynccontextmanager
    async def read_file(self, path: str) -> AsyncIterator[Reply]:
        """`GET /files`: the response once the executor found the file, its body (the content) still to be read."""
        async with self._exchange("GET", self._files(path), self._token) as reply:
            if reply.status != 200:
                raise await refused(reply)
            yield reply

    async def write_file(self, path: str, data: bytes) -> list[EntryInfo]:
        """`POST /files` of one file's content (missing directories are made): what was written."""
        headers = self._token | {"Content-Type": "application/octet-stream"}
        return _decode(_WRITTEN, await self._send("POST", self._files(path), headers, data), "POST /files")

    async def write_files(self, files: Mapping[str, bytes]) -> list[EntryInfo]:
        """`POST /files` of several files by absolute path, in one multipart request: what was written."""
        boundary = secrets.token_hex(16)
        headers = self._token | {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        written = await self._send("POST", self._files(None), headers, _multipart(files, boundary))
        return _decode(_WRITTEN, written, "POST /files")

    # POST /init and the executor's own calls

    async def init(self, request: InitRequest) -> None:
        """Apply env vars, access token, default user and workdir (`POST /init`)."""
        await self._send("POST", "/init", self._token | {"Content-Type": "application/json"}, encode(request))

    async def freeze(self) -> None:
        """Stop every process of the sandbox but the executor (`POST /agent-sandbox/freeze`); idempotent."""
        await self._send("POST", "/agent-sandbox/freeze", self._token)

    async def thaw(self) -> None:
        """Continue every process of the sandbox (`POST /agent-sandbox/thaw`); idempotent."""
        await self._send("POST", "/agent-sandbox/thaw", self._token)

    async def download_archive(self, *, limit: int) -> bytes:
        """The working directory as a tar.gz (`GET /agent-sandbox/archive`); ExecutorError past `limit` bytes."""
        return await self._send("GET", "/agent-sandbox/archive", self._token, limit=limit)

    async def upload_archive(self, archive: bytes) -> None:
        """Unpack a `download_archive` tar.gz into the working directory (`PUT /agent-sandbox/archive`)."""
        headers = self._token | {"Content-Type": "application/gzip"}
        await self._send("PUT", "/agent-sandbox/archive", headers, archive)

    async def get(self, target: str, *, limit: int = 1 << 20) -> bytes:
        """The body of a plain `GET` the executor answers with 200 (`/metrics`, `/envs`)."""
        return await self._send("GET", target, self._token, limit=limit)

    # the steps every call shares

    async def _unary(self, method: str, request: Message, answer: msgspec.json.Decoder[T]) -> T:
        """One Connect unary call: its answer decoded as `answer`."""
        raw = await self._send("POST", f"/{method}", _UNARY_HEADERS | self._rpc, encode(request))
        return _decode(answer, raw, method)

    async def _send(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes = b"", *, limit: int = 16 << 20
    ) -> bytes:
        """The body of a 2xx answer (ExecutorError past `limit` bytes); ExecutorRefused for any other."""
        async with self._exchange(method, target, headers, body) as reply:
            if not 200 <= reply.status < 300:
                raise await refused(reply)
            return await reply.read(limit)

    def _exchange(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes = b""
    ) -> AbstractAsyncContextManager[Reply]:
        return self._transport.exchange(method, target, headers, body)

    def _files(self, path: str | None) -> str:
        query = {"path": path} if path is not None else {}
        if self._user is not None:
            query["username"] = self._user
        return "/files?" + urllib.parse.urlencode(query) if query else "/files"


def shell_command(
    command: str, *, cwd: str | None = None, envs: Mapping[str, str] | None = None, tag: str | None = None
) -> StartRequest:
    """The StartRequest of `bash -l -c command` with stdin closed, as the SDK's `commands.run` sends it."""
    config = ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command], envs=dict(envs or {}), cwd=cwd)
    return StartRequest(process=config, tag=tag, stdin=False)


async def _events(reply: Reply) -> AsyncGenerator[ProcessEvent, None]:
    """The events of a Start stream as each envelope completes; an error trailer is raised as ExecutorRefused."""
    async for flags, payload in envelopes(reply):
        if flags & END_STREAM:
            error = trailer_error(payload)
            if error is not None:
                raise ExecutorRefused(error.code, error.message)
            return
        event = _decode(_EVENT, payload, "a Start event").event
        if event.keepalive is None:
            yield event


def _decode(answer: msgspec.json.Decoder[T], raw: bytes, what: str) -> T:
    try:
        return answer.decode(raw)
    except msgspec.DecodeError as exc:
        raise ExecutorError(f"the executor's answer to {what} is not what envd sends: {exc}: {raw[:200]!r}") from exc


def _multipart(files: Mapping[str, bytes], boundary: str) -> bytes:
    """`multipart/form-data` with one `file` part per path (the part's filename), as envd's /files reads it."""
    parts = []
    for path, content in files.items():
        name = path.translate({0x22: "%22", 0x5C: "\\\\"})
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
        parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + content + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode()
