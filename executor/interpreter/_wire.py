"""The JSON of port 49999 (e2b-protocol.md §4): request bodies, context records and the NDJSON lines of /execute.

Every output line is a tagged struct whose tag lands in `type`, encoded on one line with no blank lines in
between (the SDK feeds every line to `json.loads`). `Result` keeps the MIME bundle a kernel produced, under
the short names the SDK reads; MIME types it has no name for go to `extra`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

__all__ = (
    "ContextInfo",
    "CreateContext",
    "EndOfExecution",
    "Error",
    "ExecuteRequest",
    "Keepalive",
    "Line",
    "NumberOfExecutions",
    "Result",
    "Stderr",
    "Stdout",
    "encode_line",
    "now",
    "result_from_bundle",
)


class ExecuteRequest(msgspec.Struct, kw_only=True):
    """`POST /execute`: the SDK always sends all four keys, null when unset."""

    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[str, str] | None = None


class CreateContext(msgspec.Struct, kw_only=True):
    """`POST /contexts`: keys only when given."""

    language: str | None = None
    cwd: str | None = None


class ContextInfo(msgspec.Struct, kw_only=True):
    """A context as `POST /contexts` and `GET /contexts` report it."""

    id: str
    language: str
    cwd: str


class _Line(msgspec.Struct, kw_only=True, tag_field="type"):
    """One NDJSON line of an /execute response."""


class NumberOfExecutions(_Line, kw_only=True, tag="number_of_executions"):
    """The execution count the kernel gave this cell (always the first line)."""

    execution_count: int


class Stdout(_Line, kw_only=True, tag="stdout"):
    """Text the code wrote to stdout, sent as soon as the kernel publishes it."""

    text: str
    timestamp: str


class Stderr(_Line, kw_only=True, tag="stderr"):
    """Text the code wrote to stderr."""

    text: str
    timestamp: str


class Result(_Line, kw_only=True, tag="result", omit_defaults=True):
    """A display (`is_main_result` false) or the value of the cell's last expression (true)."""

    is_main_result: bool = msgspec.field(default_factory=lambda: False)  # a factory, so omit_defaults keeps it
    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: Any = None
    javascript: str | None = None
    data: Any = None
    chart: Any = None
    extra: dict[str, Any] | None = None


class Error(_Line, kw_only=True, tag="error"):
    """The exception that ended the cell (or why the service ended it)."""

    name: str
    value: str
    traceback: str


class Keepalive(_Line, kw_only=True, tag="keepalive"):
    """Sent while nothing else is: keeps proxies and the SDK's read timeout from closing a quiet stream."""


class EndOfExecution(_Line, kw_only=True, tag="end_of_execution"):
    """The last line of every response whose execution ran to its end."""


Line = NumberOfExecutions | Stdout | Stderr | Result | Error | Keepalive | EndOfExecution

_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

_encoder = msgspec.json.Encoder()


def encode_line(line: Line) -> bytes:
    """One line of the stream, newline included."""
    return _encoder.encode(line) + b"\n"


def now() -> str:
    """The current time as the reference server stamps output: ISO 8601 with microseconds, in UTC."""
    return datetime.now(UTC).isoformat()


def result_from_bundle(bundle: dict[str, Any], *, is_main_result: bool) -> Result:
    """A `result` line from a Jupyter MIME bundle, keeping every representation the kernel produced."""
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for mime, value in bundle.items():
        name = _FIELDS.get(mime)
        if name is None:
            extra[mime] = value
        else:
            fields[name] = value
    text = fields.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] == "'":
        fields["text"] = text[1:-1]  # the reference strips one pair of quotes: 'abc' -> abc
    return Result(is_main_result=is_main_result, extra=extra or None, **fields)
