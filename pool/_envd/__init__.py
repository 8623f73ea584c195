"""A client of a sandbox's executor (E2B's envd protocol) over a socket already connected into the sandbox."""

from pool._envd._connect import (
    END_STREAM,
    STREAM_HEADERS,
    ConnectError,
    call_unary,
    decode_error,
    envelope,
    envelopes,
    trailer_error,
)
from pool._envd._http1 import Connection, Response, exchange

__all__ = [
    "END_STREAM",
    "STREAM_HEADERS",
    "ConnectError",
    "Connection",
    "Response",
    "call_unary",
    "decode_error",
    "envelope",
    "envelopes",
    "exchange",
    "trailer_error",
]
