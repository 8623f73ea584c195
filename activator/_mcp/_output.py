"""Bounded capture of what tools return: enough for a model to use, never so much that it floods its context.

Command output keeps the first and the last half of `MAX_STREAM_BYTES` of each stream (the head shows what
started, the tail how it ended: errors are usually at the end) and replaces what lies between with a marker
that says how many bytes were dropped. Files are cut after `MAX_FILE_BYTES`, with the same kind of marker.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["MAX_FILE_BYTES", "MAX_LIST_ENTRIES", "MAX_STREAM_BYTES", "CappedStream", "Rendered", "cut_marker"]

MAX_STREAM_BYTES = 64 * 1024  # per stream (stdout, stderr) of one command or code run
MAX_FILE_BYTES = 256 * 1024  # per read_file
MAX_LIST_ENTRIES = 1000  # per list_files


class Rendered(NamedTuple):
    """A tool's result whose text content is a rendering of its own for the model (a transcript), while the
    structured content keeps the data it was made from; other results' text is their JSON."""

    structured: dict[str, Any]
    text: str


def cut_marker(dropped: int, what: str, hint: str) -> str:
    """The line put where output was dropped; it starts with `[... ` so that it stands out in any text."""
    return f"\n[... {dropped} bytes of {what} cut here: {hint} ...]\n"


class CappedStream:
    """Collects one output stream, keeping its first and last `limit // 2` bytes and counting the rest."""

    def __init__(self, name: str, limit: int = MAX_STREAM_BYTES) -> None:
        self.name = name
        self.limit = limit
        self.total = 0
        self._head = bytearray()
        self._tail = bytearray()

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit // 2 - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        excess = len(self._tail) - (self.limit - self.limit // 2)  # positive only once `total` exceeds `limit`
        if excess > 0:
            del self._tail[:excess]

    @property
    def dropped(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def text(self) -> str:
        """The kept bytes as UTF-8 (invalid sequences replaced), with the marker where bytes were dropped."""
        head = self._head.decode(errors="replace")
        tail = self._tail.decode(errors="replace")
        if not self.dropped:
            return head + tail
        hint = f"at most {self.limit} bytes per stream are returned, the first and last {self.limit // 2}"
        hint += "; redirect the output to a file and read parts of it (head, tail, grep) to see more"
        return head + cut_marker(self.dropped, self.name, hint) + tail
