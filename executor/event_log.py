"""An append-only log of JSON records on disk, numbered from 1, readable from any number while it grows.

Each record is one line of the file. An index of where each line starts is kept in memory (8 bytes a
record), so reading from sequence N seeks straight to it; nothing is dropped, unlike upstream's
1024-entry ring. A torn last line (the executor killed mid-write) is cut off when the log is reopened.
`wait()` lets readers sleep until a record past the one they have arrives, or the log is closed.

Public because the control plane keeps its copy of each session's events in the same form
(`activator._agent_archive`), so a sequence means the same record on both sides.
"""

from __future__ import annotations

import asyncio
import os
from array import array

__all__ = ("EventLog",)


class EventLog:
    """Records 1..len(self) in `path`; `append` is synchronous (one write of one line)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._starts = array("q")
        self._size = 0
        self._closed = False
        self._changed = asyncio.Event()
        self._load()

    def __len__(self) -> int:
        return len(self._starts)

    @property
    def closed(self) -> bool:
        """Whether no record will follow (the session or server ended)."""
        return self._closed

    def append(self, line: bytes) -> int:
        """Store one record (JSON without newlines); its sequence number."""
        if b"\n" in line:
            raise ValueError("a record must be one line")
        if self._closed:
            raise ValueError("the log is closed")
        record = memoryview(line + b"\n")
        with open(self.path, "ab", buffering=0) as file:  # no descriptor held per session: there may be many
            try:
                while record:  # a raw write may be short
                    record = record[file.write(record) :]
            except OSError:  # disk full, a file size limit: take the torn record back, so the log stays whole
                os.truncate(self.path, self._size)
                raise
        self._starts.append(self._size)
        self._size += len(line) + 1
        self._wake()
        return len(self._starts)

    def read(self, after: int, limit: int | None = None) -> list[bytes]:
        """Records with sequence > `after`, in order, at most `limit` of them."""
        first = max(after, 0)
        last = len(self._starts) if limit is None else min(len(self._starts), first + limit)
        if first >= last:
            return []
        end = self._starts[last] if last < len(self._starts) else self._size
        with open(self.path, "rb") as file:
            file.seek(self._starts[first])
            data = file.read(end - self._starts[first])
        return data.split(b"\n")[: last - first]

    async def wait(self, after: int, timeout: float) -> None:  # noqa: ASYNC109 - a bounded wait, not a deadline
        """Return once a record past `after` exists or the log is closed, or after `timeout` seconds."""
        while len(self._starts) <= after and not self._closed:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return

    def close(self) -> None:
        """No more records: wake every reader so that it can finish."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()

    def _load(self) -> None:
        """Index what is already in the file, cutting a torn last line."""
        try:
            with open(self.path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            os.truncate(self.path, complete)
        position = 0
        while position < complete:
            self._starts.append(position)
            position = data.index(b"\n", position) + 1
        self._size = complete
