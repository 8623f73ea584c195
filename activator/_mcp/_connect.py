"""`process.Process/Start` as the tools use it (e2b-protocol.md §3.3, §3.5): the enveloped request, and the
events of its response stream (the envelopes themselves are read by `pool.envd`).
"""

from __future__ import annotations

import msgspec

from activator._mcp._errors import ExecutorFailed
from activator._mcp._output import CappedStream
from pool import envd

__all__ = ["End", "decode_event", "follow", "start_body", "stream_error"]


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


_encoder = msgspec.json.Encoder()
_message = msgspec.json.Decoder(_Message)


def start_body(command: str, cwd: str, envs: dict[str, str]) -> bytes:
    """The enveloped StartRequest of `bash -l -c command` (stdin closed, as the SDK's `commands.run`)."""
    config = _Config(cmd="/bin/bash", args=["-l", "-c", command], envs=envs, cwd=cwd)
    message = _encoder.encode(_StartRequest(process=config))
    return envd.envelope(message)


async def follow(response: envd.Response, stdout: CappedStream, stderr: CappedStream) -> End | envd.ConnectError:
    """Collect a Start stream's output until its `end` event, or the error its trailer carries instead."""
    async for flags, payload in envd.envelopes(response):
        if flags & envd.END_STREAM:
            return stream_error(payload)
        event = decode_event(payload)
        if event.data is not None:
            stdout.add(event.data.stdout)
            stderr.add(event.data.stderr)
        if event.end is not None:
            return event.end
    return envd.ConnectError("unknown", "the executor stopped reporting the command before it ended")


def decode_event(payload: bytes) -> _Event:
    """One message of the stream: `start{pid}`, `data{stdout|stderr}`, `end{exitCode}` or a keepalive."""
    try:
        message = _message.decode(payload)
    except msgspec.DecodeError as exc:
        raise ExecutorFailed(f"the executor sent a message that is not a process event: {payload[:200]!r}") from exc
    return message.event or _Event()


def stream_error(payload: bytes) -> envd.ConnectError:
    """What a stream's end-of-stream envelope reports (a stream that ended before `end` always has an error)."""
    return envd.trailer_error(payload) or envd.ConnectError("unknown", "the stream ended before the command did")
