"""What every agent-API handler writes: JSON bodies, problem documents, SSE streams; and reading JSON bodies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from executor._errors import PayloadTooLarge
from executor._exchange import Request, Response
from executor.agent_api import PROBLEM_JSON, Problem, problem
from executor.event_log import EventLog

__all__ = (
    "HEARTBEAT_SECONDS",
    "JSON",
    "MAX_JSON_BYTES",
    "ApiError",
    "accepts",
    "count",
    "follow",
    "read_json",
    "send_json",
    "send_problem",
    "start_sse",
)

JSON = "application/json"
MAX_JSON_BYTES = 4 * 1024 * 1024
"""The largest JSON body a route takes (an ACP envelope with an embedded image fits)."""
HEARTBEAT_SECONDS = 15.0
FOLLOW_BATCH = 256
_encoder = msgspec.json.Encoder()


class ApiError(Exception):
    """Raised by a handler; answered as its problem document."""

    def __init__(self, kind: str, status: int, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.problem = problem(kind, status, detail, **extra)


async def send_json(response: Response, status: int, body: Any) -> None:
    await response.send(status, _encoder.encode(body), JSON)


async def send_problem(response: Response, body: Problem) -> None:
    await response.send(body.status, _encoder.encode(body), PROBLEM_JSON)


def count(value: str | None) -> int | None:
    """A non-negative decimal integer from a query parameter or header; None for anything else ("", "²", "-1",
    or more than 18 digits, which `int()` would take its time over)."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 18:
        return None
    return int(value)


def accepts(request: Request, media_type: str) -> bool:
    """Whether the request's Accept allows `media_type` (no header allows everything)."""
    accept = request.headers.get("accept", "")
    if not accept:
        return True
    kind = media_type.split("/")[0]
    ranges = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    return bool(ranges & {media_type, f"{kind}/*", "*/*"})


async def read_json(request: Request, kind: Any = Any) -> Any:
    """The body decoded as `kind` (any JSON by default); a problem (415, 413, 400) when it is not such JSON."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != JSON:
        raise ApiError("unsupported_media_type", 415, "unsupported media type: content-type must be application/json")
    try:
        body = await request.body.read(MAX_JSON_BYTES)
    except PayloadTooLarge as exc:
        raise ApiError("payload_too_large", 413, exc.message) from exc
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ApiError("invalid_request", 400, f"invalid JSON body: {exc}") from exc


async def start_sse(response: Response) -> None:
    await response.start(200, (("content-type", "text/event-stream"), ("cache-control", "no-cache")))


async def follow(
    response: Response,
    log: EventLog,
    after: int,
    event: bytes | None = None,
    until: Callable[[bytes], bool] | None = None,
) -> None:
    """Stream `log`'s records after `after` as SSE frames (`id:` = the sequence), then follow it until it closes.

    A comment goes out every `HEARTBEAT_SECONDS` without records, so proxies keep the stream open
    and a dead client is noticed. `event` names the frames (`event: message` for ACP). The stream
    ends after a record for which `until` is true.
    """
    head = b"event: %b\n" % event if event is not None else b""
    await start_sse(response)
    while True:
        records = log.read(after, FOLLOW_BATCH)
        if records:
            last = next((i for i, record in enumerate(records) if until is not None and until(record)), None)
            records = records if last is None else records[: last + 1]
            frames = [b"%bid: %d\ndata: %b\n\n" % (head, after + i + 1, record) for i, record in enumerate(records)]
            after += len(records)
            await response.write(b"".join(frames))
            if last is not None:
                break
            continue
        if log.closed:
            break
        await log.wait(after, HEARTBEAT_SECONDS)
        if len(log) <= after and not log.closed:
            await response.write(b": heartbeat\n\n")
    await response.end()
