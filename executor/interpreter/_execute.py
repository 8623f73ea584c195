"""One `POST /execute` response: the execution's lines as NDJSON, flushed one chunk per line as they come.

Three things end a response besides the execution itself:
- silence: after `KEEPALIVE_SECONDS` without a line a `{"type":"keepalive"}` goes out (the reference's
  interval), which keeps proxies and the SDK's read timeout from giving up on a long quiet cell;
- the client leaving (the SDK's `timeout` closes the stream): the handler is cancelled by the HTTP server
  and sets `stop`, and the context interrupts the kernel with nobody listening;
- the server's own limit (`limit` seconds): `stop` is set, the kernel's KeyboardInterrupt is replaced by
  one `TimeoutError` line that says what happened, and the response ends normally.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from executor._exchange import Response
from executor.interpreter._contexts import Context, Contexts
from executor.interpreter._wire import EndOfExecution, Error, Keepalive, Line, encode_line

__all__ = ("KEEPALIVE_SECONDS", "stream_execution")

KEEPALIVE_SECONDS = 5.0
_HEADERS = (("content-type", "application/json"), ("cache-control", "no-store"))


async def stream_execution(
    contexts: Contexts, context: Context, code: str, env: Mapping[str, str], response: Response, limit: float | None
) -> None:
    """Run `code` in `context` and stream its lines to `response` until it ends, the client leaves or `limit`."""
    lines: asyncio.Queue[Line | None] = asyncio.Queue()
    stop = asyncio.Event()
    contexts.submit(context, code, env, lines.put_nowait, stop)
    try:
        await response.start(200, _HEADERS)
        timed_out = await _relay(lines, response, stop, limit)
        if timed_out:
            await response.write(encode_line(_timeout_error(limit or 0)))
        await response.write(encode_line(EndOfExecution()))
        await response.end()
    finally:
        stop.set()  # a no-op once the execution ended; otherwise the client is gone: interrupt it


async def _relay(
    lines: asyncio.Queue[Line | None], response: Response, stop: asyncio.Event, limit: float | None
) -> bool:
    """Write lines until the execution ends; True when the limit interrupted it."""
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    timed_out = False
    while True:
        wait = KEEPALIVE_SECONDS if deadline is None else min(KEEPALIVE_SECONDS, max(deadline - loop.time(), 0))
        try:
            line = await asyncio.wait_for(lines.get(), wait)  # Queue.get loses nothing when cancelled
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                stop.set()
                deadline, timed_out = None, True
            else:
                await response.write(encode_line(Keepalive()))
            continue
        if line is None:
            return timed_out
        if timed_out and isinstance(line, Error) and line.name in ("KeyboardInterrupt", "ExecutionCancelled"):
            continue  # the interrupt was ours: the TimeoutError line says why
        await response.write(encode_line(line))


def _timeout_error(limit: float) -> Error:
    value = f"Execution exceeded the interpreter's limit of {limit:g} s and was interrupted"
    return Error(name="TimeoutError", value=value, traceback=f"TimeoutError: {value}")
