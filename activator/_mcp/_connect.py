"""Connect as `process.Process/Start` uses it (e2b-protocol.md §3.3, §3.5): the enveloped request, and the
response stream read envelope by envelope (a 5-byte header: flags, big-endian length; then a JSON message).
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import msgspec

from activator._mcp._errors import ExecutorFailed
from activator._mcp._http1 import Response
from activator._mcp._output import CappedStream

__all__ = ["END_STREAM", "ConnectError", "End", "decode_error", "decode_event", "envelopes", "follow", "start_body"]

END_STREAM = 0x02  # envelope flag: the trailer follows, with an error or nothing


class _Config(msgspec.Struct, omit_defaults=True):
    cmd: str
    args: list[str]
    envs: dict[str, str] = {}
    cwd: str = ""


class _StartRequest(msgspec.Struct):
    process: _Config
    stdin: bool = False


class _Started(msgspec.Struct):
    pid: int = 0


class _Data(msgspec.Struct):
    stdout: bytes = b""
    stderr: bytes = b""


class End(msgspec.Struct, rename="camel"):
    """How the process ended."""

    exit_code: int = 0
    status: str = ""


class _Event(msgspec.Struct):
    start: _Started | None = None
    data: _Data | None = None
    end: End | None = None


class _Message(msgspec.Struct):
    event: _Event | None = None


class ConnectError(msgspec.Struct):
    """A Connect error: of a unary call's body, or in a stream's trailer."""

    code: str = "unknown"  # a Connect error code: "deadline_exceeded", "not_found", ...
    message: str = ""


class _Trailer(msgspec.Struct):
    error: ConnectError | None = None


_encoder = msgspec.json.Encoder()
_message = msgspec.json.Decoder(_Message)
_trailer = msgspec.json.Decoder(_Trailer)
_error = msgspec.json.Decoder(ConnectError)


def start_body(command: str, cwd: str, envs: dict[str, str]) -> bytes:
    """The enveloped StartRequest of `bash -l -c command` (stdin closed, as the SDK's `commands.run`)."""
    config = _Config(cmd="/bin/bash", args=["-l", "-c", command], envs=envs, cwd=cwd)
    message = _encoder.encode(_StartRequest(process=config))
    return struct.pack(">BI", 0, len(message)) + message


def decode_error(raw: bytes) -> ConnectError:
    """The error of a unary call's body (`{"code": "...", "message": "..."}`), whatever the body is."""
    try:
        return _error.decode(raw)
    except msgspec.DecodeError:
        return ConnectError("unknown", raw[:200].decode(errors="replace"))


async def envelopes(response: Response) -> AsyncIterator[tuple[int, bytes]]:
    """The (flags, payload) of each Connect envelope of a streaming response, as each one completes."""
    if response.status != 200:
        error = decode_error(await response.read(4096))
        raise ExecutorFailed(f"the executor refused the call: {error.code}: {error.message}")
    buffer = bytearray()
    async for chunk in response.chunks():
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = struct.unpack_from(">BI", buffer)
            if len(buffer) < 5 + size:
                break
            yield flags, bytes(buffer[5 : 5 + size])
            del buffer[: 5 + size]


async def follow(response: Response, stdout: CappedStream, stderr: CappedStream) -> End | ConnectError:
    """Collect a Start stream's output until its `end` event, or the error its trailer carries instead."""
    async for flags, payload in envelopes(response):
        if flags & END_STREAM:
            return trailer_error(payload)
        event = decode_event(payload)
        if event.data is not None:
            stdout.add(event.data.stdout)
            stderr.add(event.data.stderr)
        if event.end is not None:
            return event.end
    return ConnectError("unknown", "the executor stopped reporting the command before it ended")


def decode_event(payload: bytes) -> _Event:
    """One message of the stream: `start{pid}`, `data{stdout|stderr}`, `end{exitCode}` or a keepalive."""
    try:
        message = _message.decode(payload)
    except msgspec.DecodeError as exc:
        raise ExecutorFailed(f"the executor sent a message that is not a process event: {payload[:200]!r}") from exc
    return message.event or _Event()


def trailer_error(payload: bytes) -> ConnectError:
    """What a stream's end-of-stream envelope reports (a stream that ended before `end` always has an error)."""
    try:
        return _trailer.decode(payload).error or ConnectError("unknown", "the stream ended before the command did")
    except msgspec.DecodeError:
        return ConnectError("unknown", payload[:200].decode(errors="replace"))
