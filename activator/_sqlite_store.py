"""The local state store: one SQLite database in the data directory holding sandbox records, API-key digests,
the claimed Idempotency-Keys (`_idempotency`) and the templates keys built (`_template_records`).

Records are msgspec JSON blobs; the columns beside them (owner, state, created_at, end_at) exist only to be
indexed. sqlite3 objects must stay on the thread that made them, so the one connection lives on one dedicated
thread and every method hands its work to that thread: the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from activator._errors import ActivatorError
from activator._idempotency import ClaimedKey
from activator._records import ApiKey, KeyLimits, SandboxRecord, SandboxState
from activator._store import Cursor
from activator._template_records import BuildRecord, TemplateRecord

__all__ = ["SqliteStore"]

T = TypeVar("T")

# A verified key is answered from memory for this long: `agent-sandbox keys revoke` runs in another process, and
# its revocation reaches a running server within this delay (one indexed read per key and period).
_KEY_RECHECK = 1.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL,
    created_at REAL NOT NULL, end_at REAL NOT NULL, record BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS sandboxes_by_owner ON sandboxes (owner, created_at, id);
CREATE INDEX IF NOT EXISTS sandboxes_by_state ON sandboxes (state, end_at);
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, digest TEXT NOT NULL UNIQUE, name TEXT NOT NULL, created_at REAL NOT NULL,
    limits BLOB NOT NULL DEFAULT '{}', revoked_at REAL);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    owner TEXT NOT NULL, key TEXT NOT NULL, at REAL NOT NULL, claim BLOB NOT NULL, PRIMARY KEY (owner, key));
CREATE INDEX IF NOT EXISTS idempotency_keys_by_age ON idempotency_keys (at);
CREATE TABLE IF NOT EXISTS templates (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS template_builds (
    id TEXT PRIMARY KEY, template_id TEXT NOT NULL, created_at REAL NOT NULL, record BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS template_builds_by_template ON template_builds (template_id, created_at);
"""

# Columns added to api_keys after its first release, added to older databases as they open (`_connect`).
_LATER_KEY_COLUMNS = {"limits": "BLOB NOT NULL DEFAULT '{}'", "revoked_at": "REAL"}
_KEY_COLUMNS = "id, name, created_at, limits, revoked_at"

_encode = msgspec.json.Encoder().encode
_decode_limits = msgspec.json.Decoder(KeyLimits).decode
_decode_record = msgspec.json.Decoder(SandboxRecord).decode
_decode_claim = msgspec.json.Decoder(ClaimedKey).decode
_decode_template = msgspec.json.Decoder(TemplateRecord).decode
_decode_build = msgspec.json.Decoder(BuildRecord).decode


class SqliteStore:
    """Sandbox records and API keys in SQLite (WAL), used from a single dedicated thread."""

    def __init__(self, conn: sqlite3.Connection, thread: ThreadPoolExecutor) -> None:
        self._conn = conn  # touched only on `_thread`
        self._thread = thread
        # digest -> (key id, monotonic time it was read): `key_id` without a disk read. Event loop only.
        self._key_ids: dict[str, tuple[str, float]] = {}

    @classmethod
    async def open(cls, path: Path) -> SqliteStore:
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

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        """The record in any state, or None."""
        sql = "SELECT record FROM sandboxes WHERE id = ?"
        row = await self._run(lambda conn: conn.execute(sql, (sandbox_id,)).fetchone())
        return None if row is None else _decode_record(row[0])

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
        """As `Store.page`; `keep` runs on the store's thread."""
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
        """Store a new API key by its digest; a digest already stored is kept as it is."""
        row = (key.id, digest, key.name, key.created_at, _encode(key.limits), key.revoked_at)
        sql = "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING"
        await self._run(lambda conn: conn.execute(sql, row))

    async def keys(self) -> list[ApiKey]:
        """Every API key, revoked ones included, oldest first."""
        sql = f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY created_at, id"
        return await self._run(lambda conn: [_key_of(row) for row in conn.execute(sql)])

    async def key(self, key_id: str) -> ApiKey | None:
        """The key with this id (one indexed read: `keys update` in another process applies at once)."""
        sql = f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?"
        row = await self._run(lambda conn: conn.execute(sql, (key_id,)).fetchone())
        return None if row is None else _key_of(row)

    async def key_id(self, digest: str) -> str | None:
        """The id of the unrevoked key with this digest, if there is one (from memory for `_KEY_RECHECK` s)."""
        cached = self._key_ids.get(digest)
        if cached is not None and time.monotonic() - cached[1] < _KEY_RECHECK:
            return cached[0]
        sql = "SELECT id FROM api_keys WHERE digest = ? AND revoked_at IS NULL"
        row = await self._run(lambda conn: conn.execute(sql, (digest,)).fetchone())
        if row is None:
            self._key_ids.pop(digest, None)
            return None
        self._key_ids[digest] = (str(row[0]), time.monotonic())
        return str(row[0])

    async def update_key(self, key: ApiKey) -> bool:
        """Replace the key's name, limits and revocation; False if there was none with this id."""
        row = (key.name, _encode(key.limits), key.revoked_at, key.id)
        # Revocation is one way: an update read before a concurrent revoke must not bring the key back.
        sql = "UPDATE api_keys SET name = ?, limits = ?, revoked_at = COALESCE(revoked_at, ?) WHERE id = ?"
        updated = await self._run(lambda conn: conn.execute(sql, row).rowcount > 0)
        # After the update: a read of the key queued before it has landed in the cache by now, and goes too.
        self._key_ids = {digest: entry for digest, entry in self._key_ids.items() if entry[0] != key.id}
        return updated

    async def claim_key(self, claim: ClaimedKey, *, expired_before: float) -> ClaimedKey | None:
        """As `KeyLedger.claim_key`: expired claims of every key go first, then the insert either lands or
        finds the claim that stands (one thread runs both, so no other claim comes between)."""
        row = (claim.owner, claim.key, claim.at, _encode(claim))

        def claim_or_find(conn: sqlite3.Connection) -> ClaimedKey | None:
            conn.execute("DELETE FROM idempotency_keys WHERE at < ?", (expired_before,))
            if conn.execute("INSERT INTO idempotency_keys VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING", row).rowcount:
                return None
            sql = "SELECT claim FROM idempotency_keys WHERE owner = ? AND key = ?"
            return _decode_claim(conn.execute(sql, (claim.owner, claim.key)).fetchone()[0])

        return await self._run(claim_or_find)

    async def settle_key(self, claim: ClaimedKey) -> None:
        """Replace the claim by `claim`, which carries the answer."""
        row = (claim.owner, claim.key, claim.at, _encode(claim))
        await self._run(lambda conn: conn.execute("INSERT OR REPLACE INTO idempotency_keys VALUES (?, ?, ?, ?)", row))

    async def release_key(self, owner: str, key: str) -> None:
        """Delete the claim of (owner, key)."""
        sql = "DELETE FROM idempotency_keys WHERE owner = ? AND key = ?"
        await self._run(lambda conn: conn.execute(sql, (owner, key)))

    async def put_template(self, record: TemplateRecord) -> None:
        row = (record.template_id, record.owner, record.created_at, _encode(record))
        await self._run(lambda conn: conn.execute("INSERT OR REPLACE INTO templates VALUES (?, ?, ?, ?)", row))

    async def delete_template(self, template_id: str) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM template_builds WHERE template_id = ?", (template_id,))
            conn.execute("DELETE FROM templates WHERE id = ?", (template_id,))

        await self._run(delete)

    async def put_build(self, record: BuildRecord) -> None:
        row = (record.build_id, record.template_id, record.created_at, _encode(record))
        await self._run(lambda conn: conn.execute("INSERT OR REPLACE INTO template_builds VALUES (?, ?, ?, ?)", row))

    async def built_templates(self) -> list[tuple[TemplateRecord, list[BuildRecord]]]:
        def scan(conn: sqlite3.Connection) -> list[tuple[TemplateRecord, list[BuildRecord]]]:
            builds: dict[str, list[BuildRecord]] = {}
            for (raw,) in conn.execute("SELECT record FROM template_builds ORDER BY created_at, id"):
                build = _decode_build(raw)
                builds.setdefault(build.template_id, []).append(build)
            rows = conn.execute("SELECT record FROM templates ORDER BY created_at, id")
            return [(t, builds.get(t.template_id, [])) for t in (_decode_template(raw) for (raw,) in rows)]

        return await self._run(scan)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, work, self._conn)
        except sqlite3.Error as exc:
            raise ActivatorError(f"the state store failed: {exc}") from exc


def _make_private(path: Path) -> None:
    """The database and its -wal/-shm readable by the server's user only (0600), also when an older server or the
    CLI made them with the umask's mode: records hold envd and traffic tokens in clear (docs/security.md, "State
    on disk"). SQLite gives the -wal/-shm files it creates the database's mode, so they follow."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    for file in (path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")):
        with contextlib.suppress(FileNotFoundError):
            file.chmod(0o600)


def _connect(path: Path) -> sqlite3.Connection:
    _make_private(path)
    conn = sqlite3.connect(path, isolation_level=None)  # autocommit: every statement is its own transaction
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes, fast commits
    conn.executescript(_SCHEMA)
    present = {row[1] for row in conn.execute("PRAGMA table_info(api_keys)")}
    for column, declaration in _LATER_KEY_COLUMNS.items():
        if column not in present:
            conn.execute(f"ALTER TABLE api_keys ADD COLUMN {column} {declaration}")
    return conn


def _key_of(row: tuple[str, str, float, bytes | str, float | None]) -> ApiKey:
    key_id, name, created_at, limits, revoked_at = row
    return ApiKey(id=key_id, name=name, created_at=created_at, limits=_decode_limits(limits), revoked_at=revoked_at)


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
