"""The Connect protocol with the JSON codec, hand-written (importing connectrpc costs ~120 ms here).

Three kinds of RPC, one class each (e2b-protocol.md §3.3):

* `Unary`: `application/json` in and out; errors are an HTTP status plus `{"code","message"}`.
* `ServerStream`: `application/connect+json`; one enveloped request message, then HTTP 200 and
  one envelope per response message, flushed as it is sent, ended by an end-of-stream envelope
  (flag 0x02) holding `{}` or `{"error": {...}}`. `Keepalive-Ping-Interval` (seconds) makes the
  stream send the method's keepalive message whenever it has been quiet that long.
* `ClientStream`: enveloped request messages as they arrive; the reply is exactly one data
  envelope plus `{}` end-of-stream (the SDK rejects a bare end-of-stream), or an error end-of-stream.

`Connect-Timeout-Ms` bounds every handler; expiry is `deadline_exceeded`. Compression is refused.
Any ExecutorError becomes its Connect code; anything else is logged and becomes `internal`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from executor._envelopes import decode, read_messages, read_single_message
from executor._errors import DeadlineExceeded, ExecutorError, Internal, InvalidArgument, Unimplemented
from executor._exchange import Request, Response
from executor.envd import (
    END_STREAM,
    MAX_MESSAGE_BYTES,
    STREAM_TYPE,
    UNARY_TYPE,
    EndOfStream,
    ErrorBody,
    Message,
    decoder,
    encode,
    envelope,
)

__all__ = ("Call", "ClientStream", "Rpc", "ServerStream", "Stream", "Unary", "send_error")

logger = logging.getLogger("executor")

HTTP_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

Req = TypeVar("Req", bound=Message)


@dataclass(frozen=True)
class Call:
    """What a handler may know about an RPC besides its message."""

    headers: Mapping[str, str]
    timeout: float | None


class Stream:
    """The sending side of a server stream; `send()` writes one envelope and flushes it."""

    def __init__(self, response: Response) -> None:
        self._response = response
        self.last_sent = asyncio.get_running_loop().time()

    @classmethod
    async def open(cls, response: Response) -> Stream:
        """Send the 200 and the streaming content type (stream errors go in the end-of-stream)."""
        await response.start(200, (("content-type", STREAM_TYPE),))
        return cls(response)

    async def send(self, message: Message) -> None:
        await self.send_raw(encode(message))

    async def send_raw(self, payload: bytes, flags: int = 0) -> None:
        self.last_sent = asyncio.get_running_loop().time()
        await self._response.write(envelope(payload, flags))

    async def close(self, error: ExecutorError | None) -> None:
        """Send the end-of-stream envelope and finish the response."""
        end = b"{}" if error is None else encode_error(error, wrap=True)
        await self.send_raw(end, END_STREAM)
        await self._response.end()


class Rpc(abc.ABC):
    """One method of a service."""

    content_type = UNARY_TYPE

    @abc.abstractmethod
    async def serve(self, request: Request, response: Response) -> None:
        """Answer one call of this method."""

    async def _refuse_bad_framing(self, request: Request, response: Response) -> bool:
        """Answer requests this method cannot read (wrong codec, compression) with a plain error."""
        problem = _framing_problem(request.headers, self.content_type)
        if problem is not None:
            await send_error(response, problem)
        return problem is not None


class Unary(Rpc, Generic[Req]):
    """A request/response method; its handler may be a plain function (filesystem calls are)."""

    def __init__(self, request_type: type[Req], handler: Callable[[Req, Call], Message | Awaitable[Message]]) -> None:
        self._decoder = decoder(request_type)
        self._handler = handler

    async def serve(self, request: Request, response: Response) -> None:
        if await self._refuse_bad_framing(request, response):
            return
        try:
            call = _call(request.headers)
            message = decode(self._decoder, await request.body.read(MAX_MESSAGE_BYTES) or b"{}")
            async with deadline(call.timeout):
                result = self._handler(message, call)
                reply = await result if inspect.isawaitable(result) else result
        except Exception as exc:
            await send_error(response, as_rpc_error(exc))
            return
        await response.send(200, encode(reply), UNARY_TYPE)


class ServerStream(Rpc, Generic[Req]):
    """A method that answers one request with a stream of messages."""

    content_type = STREAM_TYPE

    def __init__(
        self,
        request_type: type[Req],
        handler: Callable[[Req, Call, Stream], Awaitable[None]],
        keepalive: Message,
    ) -> None:
        self._decoder = decoder(request_type)
        self._handler = handler
        self._keepalive = encode(keepalive)

    async def serve(self, request: Request, response: Response) -> None:
        if await self._refuse_bad_framing(request, response):
            return
        error: ExecutorError | None = None
        stream: Stream | None = None
        try:
            call = _call(request.headers)
            message = await read_single_message(request.body, self._decoder)
            stream = await Stream.open(response)
            async with deadline(call.timeout), self._keepalives(stream, request.headers):
                await self._handler(message, call, stream)
        except Exception as exc:
            error = as_rpc_error(exc)
        await (stream or await Stream.open(response)).close(error)

    @contextlib.asynccontextmanager
    async def _keepalives(self, stream: Stream, headers: Mapping[str, str]) -> AsyncIterator[None]:
        interval = _keepalive_interval(headers)
        if interval is None:
            yield
            return
        task = asyncio.get_running_loop().create_task(_send_keepalives(stream, interval, self._keepalive))
        try:
            yield
        finally:
            task.cancel()


class ClientStream(Rpc, Generic[Req]):
    """A method that reads a stream of messages and answers once."""

    content_type = STREAM_TYPE

    def __init__(
        self, request_type: type[Req], handler: Callable[[AsyncIterator[Req], Call], Awaitable[Message]]
    ) -> None:
        self._decoder = decoder(request_type)
        self._handler = handler

    async def serve(self, request: Request, response: Response) -> None:
        if await self._refuse_bad_framing(request, response):
            return
        error: ExecutorError | None = None
        reply: Message | None = None
        try:
            call = _call(request.headers)
            async with deadline(call.timeout):
                reply = await self._handler(read_messages(request.body, self._decoder), call)
        except Exception as exc:
            error = as_rpc_error(exc)
        stream = await Stream.open(response)
        if reply is not None:
            await stream.send(reply)
        await stream.close(error)


def as_rpc_error(exc: Exception) -> ExecutorError:
    """The error a client sees for `exc`; unexpected ones are logged with their traceback.

    A lost connection is no error to report: it is re-raised so the HTTP layer drops the connection.
    """
    if isinstance(exc, ExecutorError):
        return exc
    if isinstance(exc, ConnectionError):
        raise exc
    logger.error("unexpected error in RPC handler", exc_info=exc)
    return Internal(f"internal error: {type(exc).__name__}: {exc}")


def encode_error(error: ExecutorError, wrap: bool = False) -> bytes:
    body = ErrorBody(code=error.code, message=error.message)
    return encode(EndOfStream(error=body) if wrap else body)


async def send_error(response: Response, error: ExecutorError, status: int | None = None) -> None:
    """A unary-style Connect error: the code's HTTP status (unless given) and a JSON body."""
    await response.send(status or HTTP_STATUS.get(error.code, 500), encode_error(error), UNARY_TYPE)


@contextlib.asynccontextmanager
async def deadline(seconds: float | None) -> AsyncIterator[None]:
    """Bound the body by the caller's Connect-Timeout-Ms."""
    if seconds is None:
        yield
        return
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as exc:
        raise DeadlineExceeded(f"deadline of {seconds * 1000:.0f} ms exceeded") from exc


def _framing_problem(headers: Mapping[str, str], expected: str) -> ExecutorError | None:
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if content_type != expected:
        return Unimplemented(
            f"unsupported content-type {content_type!r} for this method: expected {expected!r} "
            "(only the JSON codec is served)"
        )
    encoding_header = "content-encoding" if expected == UNARY_TYPE else "connect-content-encoding"
    if headers.get(encoding_header, "identity").lower() != "identity":
        return Unimplemented(f"unsupported {encoding_header} {headers[encoding_header]!r}: only identity")
    return None


def _call(headers: Mapping[str, str]) -> Call:
    raw = headers.get("connect-timeout-ms")
    if raw is None:
        return Call(headers, None)
    if not raw.isdigit() or len(raw) > 10:
        raise InvalidArgument(f"invalid Connect-Timeout-Ms {raw!r}")
    return Call(headers, int(raw) / 1000)


def _keepalive_interval(headers: Mapping[str, str]) -> float | None:
    try:
        interval = float(headers.get("keepalive-ping-interval", ""))
    except ValueError:
        return None
    return interval if interval > 0 else None


async def _send_keepalives(stream: Stream, interval: float, payload: bytes) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionError):  # the stream's own handler sees the disconnect too
        while True:
            await asyncio.sleep(max(stream.last_sent + interval - loop.time(), 0.01))
            if loop.time() - stream.last_sent >= interval:
                await stream.send_raw(payload)
