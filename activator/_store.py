"""The state store: one SQLite database in the data directory holding sandbox records and API-key digests.

Records are msgspec JSON blobs; the columns beside them (owner, state, created_at, end_at) exist only to be
indexed. sqlite3 objects must stay on the thread that made them, so the one connection lives on one dedicated
thread and every method hands its work to that thread: the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import base64
import sqlite3
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from activator._errors import ActivatorError, InvalidRequest
from activator._records import ApiKey, SandboxRecord, SandboxState

__all__ = ["Cursor", "Store", "decode_cursor", "encode_cursor"]

T = TypeVar("T")
Cursor = tuple[float, str]  # (created_at, id): the listing order, and where the next page starts

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL,
    created_at REAL NOT NULL, end_at REAL NOT NULL, record BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS sandboxes_by_owner ON sandboxes (owner, created_at, id);
CREATE INDEX IF NOT EXISTS sandboxes_by_state ON sandboxes (state, end_at);
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, name TEXT NOT NULL, created_at REAL NOT NULL);
"""

_encode = msgspec.json.Encoder().encode
_decode_record = msgspec.json.Decoder(SandboxRecord).decode
_decode_cursor = msgspec.json.Decoder(tuple[float, str]).decode


class Store:
    """Sandbox records and API keys in SQLite (WAL), used from a single dedicated thread."""

    def __init__(self, conn: sqlite3.Connection, thread: ThreadPoolExecutor) -> None:
        self._conn = conn  # touched only on `_thread`
        self._thread = thread

    @classmethod
    async def open(cls, path: Path) -> Store:
        """Open (and create if needed) the database at `path`."""
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="activator-store")
        conn = await asyncio.get_running_loop().run_in_executor(thread, _connect, path)
        return cls(conn, thread)

    async def close(self) -> None:
        """Close the connection and stop the thread."""
        await self._run(lambda conn: conn.close())
        self._thread.shutdown()

    async def put(self, record: SandboxRecord) -> None:
        """Insert or replace a record."""
        row = (record.id, record.owner, record.state, record.created_at, record.end_at, _encode(record))
        await self._run(lambda conn: conn.execute("INSERT OR REPLACE INTO sandboxes VALUES (?, ?, ?, ?, ?, ?)", row))

    async def live(self) -> list[SandboxRecord]:
        """Every record that is not killed."""
        sql = "SELECT record FROM sandboxes WHERE state != ?"
        return await self._run(lambda conn: [_decode_record(b) for (b,) in conn.execute(sql, (SandboxState.KILLED,))])

    async def page(
        self,
        owner: str,
        states: Collection[SandboxState],
        *,
        order: Literal["asc", "desc"],
        after: Cursor | None,
        count: int,
        keep: Callable[[SandboxRecord], bool],
    ) -> list[SandboxRecord]:
        """Up to `count` of `owner`'s records in `states` for which `keep` holds, in creation order after `after`.

        `keep` runs on the store's thread, so it must only look at the record.
        """
        sql, params = _page_query(owner, states, order, after)

        def scan(conn: sqlite3.Connection) -> list[SandboxRecord]:
            found: list[SandboxRecord] = []
            for (blob,) in conn.execute(sql, params):
                record = _decode_record(blob)
                if keep(record):
                    found.append(record)
                    if len(found) == count:
                        break
            return found

        return await self._run(scan) if count > 0 and states else []

    async def purge_killed(self, before: float) -> int:
        """Delete the records of sandboxes killed before `before`; returns how many went."""
        sql = "DELETE FROM sandboxes WHERE state = ? AND end_at < ?"
        return await self._run(lambda conn: conn.execute(sql, (SandboxState.KILLED, before)).rowcount)

    async def add_key(self, key: ApiKey, digest: str) -> None:
        """Store a new API key by its digest."""
        row = (key.id, digest, key.name, key.created_at)
        await self._run(lambda conn: conn.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?)", row))

    async def keys(self) -> list[ApiKey]:
        """Every API key, oldest first."""
        sql = "SELECT id, name, created_at FROM api_keys ORDER BY created_at, id"
        return await self._run(lambda conn: [ApiKey(id=i, name=n, created_at=c) for i, n, c in conn.execute(sql)])

    async def key_id(self, digest: str) -> str | None:
        """The id of the key with this digest, if there is one."""
        sql = "SELECT id FROM api_keys WHERE digest = ?"
        row = await self._run(lambda conn: conn.execute(sql, (digest,)).fetchone())
        return None if row is None else str(row[0])

    async def delete_key(self, key_id: str) -> bool:
        """Delete a key; False if there was none with this id."""
        sql = "DELETE FROM api_keys WHERE id = ?"
        return await self._run(lambda conn: conn.execute(sql, (key_id,)).rowcount > 0)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, work, self._conn)
        except sqlite3.Error as exc:
            raise ActivatorError(f"the state store failed: {exc}") from exc


def encode_cursor(record: SandboxRecord) -> str:
    """An opaque `nextToken` that continues a listing after `record`."""
    return base64.urlsafe_b64encode(_encode((record.created_at, record.id))).decode()


def decode_cursor(token: str) -> Cursor:
    """Undo `encode_cursor`; a token we did not make is an `InvalidRequest`."""
    try:
        return _decode_cursor(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidRequest(f"invalid nextToken {token!r}") from exc


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)  # autocommit: every statement is its own transaction
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes, fast commits
    conn.executescript(_SCHEMA)
    return conn


def _page_query(
    owner: str, states: Collection[SandboxState], order: Literal["asc", "desc"], after: Cursor | None
) -> tuple[str, tuple[object, ...]]:
    direction, beyond = ("DESC", "<") if order == "desc" else ("ASC", ">")
    where = f"owner = ? AND state IN ({', '.join('?' * len(states))})"
    params: tuple[object, ...] = (owner, *states)
    if after is not None:
        where += f" AND (created_at, id) {beyond} (?, ?)"
        params += after
    return f"SELECT record FROM sandboxes WHERE {where} ORDER BY created_at {direction}, id {direction}", params
