"""A streaming `multipart/form-data` parser (sans-IO), so uploads go to disk as they arrive.

Feed it the body in any pieces; it returns what the pieces completed: a `PartStart` (with the
form field name and file name from Content-Disposition), the part's data as bytes (possibly in
several pieces), and `PART_END`. `close()` checks that the closing boundary was seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

from executor._errors import InvalidArgument

__all__ = ("PART_END", "MultipartParser", "PartEnd", "PartStart", "boundary_of")

MAX_PART_HEADER_BYTES = 16 * 1024
_PARAM = re.compile(r';\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')


@dataclass(frozen=True)
class PartStart:
    """A part begins; `name` and `filename` come from its Content-Disposition header."""

    name: str | None
    filename: str | None


class PartEnd:
    """The current part is complete."""


PART_END = PartEnd()
Event = PartStart | bytes | PartEnd


def boundary_of(content_type: str) -> bytes:
    """The boundary parameter of a multipart Content-Type, or InvalidArgument."""
    boundary = _params(content_type).get("boundary")
    if not boundary or len(boundary) > 200:
        raise InvalidArgument("multipart Content-Type without a valid boundary")
    return boundary.encode("latin-1")


class MultipartParser:
    """Splits a multipart body into parts as bytes arrive."""

    def __init__(self, boundary: bytes) -> None:
        self._delimiter = b"\r\n--" + boundary
        self._buffer = bytearray(b"\r\n")  # lets the first boundary match like the others
        self._state = self._preamble

    def feed(self, data: bytes) -> list[Event]:
        """Parse `data` after what came before; return the events it completed."""
        self._buffer += data
        events: list[Event] = []
        while self._state(events):
            pass
        return events

    def close(self) -> None:
        if self._state != self._epilogue:
            raise InvalidArgument("multipart body ended before its closing boundary")

    # Each state consumes what it can from the buffer; True means "run the next state now".

    def _preamble(self, events: list[Event]) -> bool:
        index = self._buffer.find(self._delimiter)
        if index < 0:
            del self._buffer[: max(len(self._buffer) - len(self._delimiter), 0)]
            return False
        del self._buffer[: index + len(self._delimiter)]
        self._state = self._after_boundary
        return True

    def _after_boundary(self, events: list[Event]) -> bool:
        head = bytes(self._buffer[:2])
        if len(head) < 2:
            return False
        if head == b"--":
            self._state = self._epilogue
            return True
        if head != b"\r\n":
            raise InvalidArgument("malformed multipart body: unexpected bytes after a boundary")
        del self._buffer[:2]
        self._state = self._headers
        return True

    def _headers(self, events: list[Event]) -> bool:
        end = 0 if self._buffer.startswith(b"\r\n") else self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_PART_HEADER_BYTES:
                raise InvalidArgument("multipart part headers are too large")
            return False
        block = bytes(self._buffer[:end]).decode("utf-8", "replace")
        del self._buffer[: end + (2 if end == 0 else 4)]
        headers = {}
        for line in block.split("\r\n"):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        params = _params(headers.get("content-disposition", ""))
        filename = params.get("filename*")
        filename = _rfc5987(filename) if filename else params.get("filename")
        events.append(PartStart(params.get("name"), filename))
        self._state = self._body
        return True

    def _body(self, events: list[Event]) -> bool:
        index = self._buffer.find(self._delimiter)
        if index < 0:
            keep = len(self._delimiter) - 1
            if len(self._buffer) > keep:
                events.append(bytes(self._buffer[:-keep]))
                del self._buffer[:-keep]
            return False
        if index:
            events.append(bytes(self._buffer[:index]))
        events.append(PART_END)
        del self._buffer[: index + len(self._delimiter)]
        self._state = self._after_boundary
        return True

    def _epilogue(self, events: list[Event]) -> bool:
        self._buffer.clear()
        return False


def _params(header: str) -> dict[str, str]:
    """`a; k="v"; k2=v2` → {"k": "v", "k2": "v2"}, with quoted-string escapes undone."""
    params = {}
    for key, raw in _PARAM.findall(header):
        value = raw.strip()
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        params[key.lower()] = value
    return params


def _rfc5987(value: str) -> str:
    """`UTF-8''%e2%82%ac.txt` → `€.txt`."""
    charset, _, rest = value.partition("'")
    _, _, encoded = rest.partition("'")
    return unquote(encoded, encoding=charset or "utf-8", errors="replace")
