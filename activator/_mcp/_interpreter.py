"""`run_code`: one execution on the code interpreter of a sandbox (port 49999, e2b-protocol.md §4).

`POST /execute` answers with NDJSON, one event per line, read as the lines arrive. The interpreter keeps one
context per language, so variables defined by one call are there for the next.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec

from activator._mcp._errors import CommandTimedOut, ExecutorFailed, executor_failures
from activator._mcp._output import MAX_STREAM_BYTES, CappedStream
from executor.envd import ACCESS_TOKEN_HEADER
from pool import envd

__all__ = ["INTERPRETER_PORT", "Execution", "execute"]

INTERPRETER_PORT = 49999
_MAX_RESULTS = 20
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _Request(msgspec.Struct):
    code: str
    language: str
    context_id: None = None
    env_vars: None = None


class _Line(msgspec.Struct):
    """One NDJSON line; only the fields the tool reports are decoded."""

    type: str = ""
    text: str = ""
    is_main_result: bool = False
    name: str = ""
    value: str = ""
    traceback: str = ""


class Execution(msgspec.Struct, rename="camel", omit_defaults=True):
    """What a code run printed and evaluated to, cut to the limits of `_output`."""

    stdout: str = ""
    stderr: str = ""
    results: list[str] = []  # the text form of each displayed result (the value of the last expression too)
    error: dict[str, str] | None = None  # name, value, traceback of an uncaught exception


_line = msgspec.json.Decoder(_Line)
_encoder = msgspec.json.Encoder()


async def execute(
    connect: Callable[[], Awaitable[socket.socket]],
    code: str,
    language: str,
    kill_after: float,
    *,
    token: str | None,
) -> Execution:
    """Run `code` in the interpreter's context for `language`; CommandTimedOut after `kill_after` seconds. `token`:
    the sandbox's envd access token, which the interpreter of a secure sandbox requires (as the SDK sends it)."""
    body = _encoder.encode(_Request(code=code, language=language))
    headers = {"Content-Type": "application/json"} | ({ACCESS_TOKEN_HEADER: token} if token else {})
    stdout, stderr = CappedStream("stdout"), CappedStream("stderr")
    execution = Execution()
    sock = await connect()
    try:
        with executor_failures():
            async with asyncio.timeout(kill_after), envd.exchange(sock, "POST", "/execute", headers, body) as response:
                if response.status != 200:
                    text = (await response.prefix(4096)).decode(errors="replace")
                    raise ExecutorFailed(f"the code interpreter refused the code: {response.status} {text}")
                async for line in _lines(response):
                    _apply(_line.decode(line), execution, stdout, stderr)
    except TimeoutError as exc:
        message = f"the code was still running after {kill_after:g} s; pass a larger `timeout`"
        for stream in (stdout, stderr):
            message += f"\n{stream.name} so far:\n{stream.text()}" if stream.total else ""
        raise CommandTimedOut(message) from exc
    except msgspec.DecodeError as exc:
        raise ExecutorFailed(f"the code interpreter sent a line that is not JSON: {exc}") from exc
    execution.stdout, execution.stderr = stdout.text(), stderr.text()
    return execution


async def _lines(response: envd.Response) -> AsyncIterator[bytes]:
    buffer = b""
    async for chunk in response.chunks():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


def _apply(line: _Line, execution: Execution, stdout: CappedStream, stderr: CappedStream) -> None:
    match line.type:
        case "stdout":
            stdout.add(line.text.encode())
        case "stderr":
            stderr.add(line.text.encode())
        case "result" if len(execution.results) < _MAX_RESULTS:
            execution.results.append(_cut(line.text) if line.text else "(a result with no text form, e.g. an image)")
        case "error":
            traceback = _cut(_ANSI.sub("", line.traceback))  # kernels colour tracebacks for terminals
            execution.error = {"name": line.name, "value": line.value, "traceback": traceback}


def _cut(text: str) -> str:
    cap = CappedStream("result", MAX_STREAM_BYTES)
    cap.add(text.encode())
    return cap.text()
