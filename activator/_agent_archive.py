"""The control plane's copy of every sandbox's coding-agent sessions, kept after the sandbox is gone.

`activator._agent_mirror` fills it from each sandbox's agent server; the control-plane API, the MCP tools and the
web UI read it once the sandbox is killed (and the UI's list of sessions across sandboxes at any time). A session's
events keep their sequence numbers, so an offset means the same event here as in the sandbox. On disk, under
the data dir:

    agent-sessions/<sandbox id>/sandbox.json                 whose it is (owner, template), when it ended
    agent-sessions/<sandbox id>/sessions/<session id>/info.json       the session as the sandbox last listed it
    agent-sessions/<sandbox id>/sessions/<session id>/events.jsonl    its events, one a line (`executor.event_log`)

Limits: a sandbox's copy stops growing at `max_bytes` or `max_sessions` (it is marked `truncated`: what is kept
is the first events and sessions, in order); `retention` seconds after the sandbox ended the whole copy is deleted
(0: at once). All copies together take at most `max_total_bytes`: past it the copies of ended sandboxes go first,
the longest ended first, before their retention is up; when only live sandboxes' copies are left, the one that
would grow is marked `truncated`. Once its sandbox ended, a session reads as ended, with no turn or permission
request pending, and `eventCount` is always the number of events kept.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import NamedTuple, TypeVar

import msgspec

from activator._errors import SandboxNotFound
from executor.agent_api import SESSION_ID_PATTERN, EventPage, SessionInfo, UniversalEvent
from executor.event_log import EventLog

__all__ = [
    "AGENT_SESSION_RETENTION",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_TOTAL_BYTES",
    "AgentArchive",
    "ArchivedSandbox",
    "ArchivedSession",
]

AGENT_SESSION_RETENTION = 7 * 86_400.0  # seconds a killed sandbox's sessions stay readable
DEFAULT_MAX_BYTES = 256 << 20  # of events and listings copied per sandbox
DEFAULT_MAX_SESSIONS = 1_000  # sessions copied per sandbox
DEFAULT_MAX_TOTAL_BYTES = 4 << 30  # of every sandbox's copy together
_SESSION_ID = re.compile(SESSION_ID_PATTERN)
_SANDBOX_ID = re.compile(r"[a-z0-9]{1,64}")  # `new_sandbox_id`
_EVENT = msgspec.json.Decoder(UniversalEvent)
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class ArchivedSandbox(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    owner: str  # the API key's id: no other key reads the copy
    template: str
    ended_at: float | None = None  # unix seconds it was killed (or found gone); retention counts from it
    truncated: bool = False  # the copy reached `max_bytes` or `max_sessions`: later events were not copied


class ArchivedSession(NamedTuple):
    sandbox_id: str
    sandbox: ArchivedSandbox
    info: SessionInfo

    def key(self) -> tuple[str, str, str]:
        """Where it is in `AgentArchive.across`'s order (newest first, by this key descending)."""
        return self.info.created_at, self.sandbox_id, self.info.session_id


class AgentArchive:
    """The copies under `root`; every method is synchronous (small files, one write each)."""

    def __init__(
        self,
        root: Path,
        *,
        retention: float = AGENT_SESSION_RETENTION,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.retention = retention
        self.max_bytes = max_bytes
        self.max_sessions = max_sessions
        self.max_total_bytes = max_total_bytes
        self._clock = clock
        self._logs: dict[tuple[str, str], EventLog] = {}  # open indexes of the logs written or read lately
        self._sizes: dict[str, int] = {}  # bytes kept of a sandbox, once counted
        self._total: int | None = None  # bytes kept of every sandbox, once counted
        root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def sandbox_ids(self) -> list[str]:
        return sorted(path.name for path in self.root.iterdir() if _SANDBOX_ID.fullmatch(path.name))

    def sandbox(self, owner: str, sandbox_id: str) -> ArchivedSandbox:
        """The copy's record; SandboxNotFound when there is none, or it is another key's."""
        found = self._sandbox(sandbox_id) if _SANDBOX_ID.fullmatch(sandbox_id) else None
        if found is None or found.owner != owner:
            raise SandboxNotFound(f"no sessions are kept of sandbox {sandbox_id}")
        return found

    def sessions(self, owner: str, sandbox_id: str) -> list[SessionInfo]:
        """The sandbox's sessions, newest first."""
        sandbox = self.sandbox(owner, sandbox_id)
        return sorted(self._infos(sandbox_id, sandbox), key=lambda info: info.created_at, reverse=True)

    def across(self, owner: str) -> list[ArchivedSession]:
        """Every session kept of `owner`'s sandboxes, live or ended, newest first (`ArchivedSession.key` order)."""
        found: list[ArchivedSession] = []
        for sandbox_id in self.sandbox_ids():
            sandbox = self._sandbox(sandbox_id)
            if sandbox is not None and sandbox.owner == owner:
                found += (ArchivedSession(sandbox_id, sandbox, info) for info in self._infos(sandbox_id, sandbox))
        return sorted(found, key=ArchivedSession.key, reverse=True)

    def info(self, owner: str, sandbox_id: str, session_id: str) -> SessionInfo:
        sandbox = self.sandbox(owner, sandbox_id)
        info = self._info(sandbox_id, session_id, sandbox) if _SESSION_ID.fullmatch(session_id) else None
        if info is None:
            raise SandboxNotFound(f"no session {session_id} is kept of sandbox {sandbox_id}")
        return info

    def events(self, owner: str, sandbox_id: str, session_id: str, offset: int, limit: int) -> EventPage:
        """The kept events with sequence > `offset`, at most `limit`, and whether more are kept."""
        self.info(owner, sandbox_id, session_id)
        records = self._log(sandbox_id, session_id).read(offset, limit + 1)
        return EventPage([_EVENT.decode(record) for record in records[:limit]], len(records) > limit)

    def length(self, sandbox_id: str, session_id: str) -> int:
        """How many events of the session are kept (the offset to copy on from)."""
        if not (self._session_dir(sandbox_id, session_id) / "events.jsonl").exists():
            return 0
        return len(self._log(sandbox_id, session_id))

    def keep(self, sandbox_id: str, owner: str, template: str, info: SessionInfo, events: list[UniversalEvent]) -> bool:
        """Append `events` (the next ones, in order) and `info` to the session's copy; False when the copy is full
        (nothing more is appended, and the sandbox is marked truncated)."""
        if not _SESSION_ID.fullmatch(info.session_id):
            raise ValueError(f"not a session id: {info.session_id!r}")
        stored = self._sandbox(sandbox_id)
        if stored is not None and stored.truncated:
            return False
        directory = self._session_dir(sandbox_id, info.session_id)
        if not directory.is_dir() and self._session_count(sandbox_id) >= self.max_sessions:
            return self._full(sandbox_id, f"{self.max_sessions} sessions")
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if stored is None:
            _write(self.root / sandbox_id / "sandbox.json", ArchivedSandbox(owner=owner, template=template))
        log = self._log(sandbox_id, info.session_id)
        used, room = self.size(sandbox_id), True
        lines = [msgspec.json.encode(event) for event in events]
        listing_room = len(msgspec.json.encode(info)) + 20  # its event count may grow by a few digits
        wanted = min(sum(len(line) + 1 for line in lines), max(self.max_bytes - used, 0))  # what its own cap lets in
        self._make_room(wanted + listing_room, spare={sandbox_id})
        for event, line in zip(events, lines, strict=True):
            if event.sequence != len(log) + 1:
                raise ValueError(f"session {info.session_id}: event {event.sequence} does not follow {len(log)}")
            if used + len(line) + 1 > self.max_bytes:
                room = self._full(sandbox_id, f"{self.max_bytes} bytes")
                break
            if self.total() + len(line) + 1 + listing_room > self.max_total_bytes:
                room = self._full(sandbox_id, f"{self.max_total_bytes} bytes of all sandboxes' copies")
                break
            log.append(line)
            used = self._grow(sandbox_id, used, len(line) + 1)
        listing = msgspec.json.encode(msgspec.structs.replace(info, event_count=len(log)))
        info_path = directory / "info.json"
        before = info_path.stat().st_size if info_path.exists() else 0
        _write(info_path, listing)  # also when full: what is kept is listed
        self._grow(sandbox_id, used, len(listing) - before)
        return room

    def total(self) -> int:
        """Bytes of events and listings kept of every sandbox."""
        if self._total is None:
            self._total = sum(self.size(sandbox_id) for sandbox_id in self.sandbox_ids())
        return self._total

    def _grow(self, sandbox_id: str, used: int, by: int) -> int:
        total = self.total()  # counted before the change, so that it is not counted twice
        self._sizes[sandbox_id] = used + by
        self._total = total + by
        return used + by

    def _make_room(self, needed: int, spare: Collection[str]) -> None:
        """Delete ended sandboxes' copies but those in `spare`, the longest ended first, until `needed` more bytes
        fit in `max_total_bytes` (or none is left to delete)."""
        if self.total() + needed <= self.max_total_bytes:
            return
        ended = []
        for sandbox_id in self.sandbox_ids():
            sandbox = self._sandbox(sandbox_id)
            if sandbox_id not in spare and sandbox is not None and sandbox.ended_at is not None:
                ended.append((sandbox.ended_at, sandbox_id))
        for _, sandbox_id in sorted(ended):
            if self.total() + needed <= self.max_total_bytes:
                return
            _log.warning("sandbox %s: its sessions' copy deleted before its retention is up, to keep all copies "
                         "within %d bytes", sandbox_id, self.max_total_bytes)  # fmt: skip
            self._remove(sandbox_id)

    def size(self, sandbox_id: str) -> int:
        """Bytes of events and listings kept of the sandbox."""
        size = self._sizes.get(sandbox_id)
        if size is None:
            files = (self.root / sandbox_id).glob("sessions/*/*")
            size = self._sizes[sandbox_id] = sum(path.stat().st_size for path in files)
        return size

    def ended(self, sandbox_id: str) -> None:
        """The sandbox is gone: retention counts from now (or its copy goes at once, with no retention); a copy
        already ended stays as it is."""
        sandbox = self._sandbox(sandbox_id)
        if sandbox is not None and sandbox.ended_at is not None:
            return
        if sandbox is not None:
            self._mark(sandbox_id, ended_at=self._clock())
        self._forget(sandbox_id)
        if self.retention == 0:
            self._remove(sandbox_id)

    def full(self, sandbox_id: str) -> bool:
        """Whether the sandbox's copy reached its limits (nothing more is copied)."""
        sandbox = self._sandbox(sandbox_id)
        return sandbox is not None and sandbox.truncated

    def prune(self, *, keep: Collection[str] = ()) -> int:
        """Delete the copies of sandboxes that ended over `retention` seconds ago, and those left unreadable (a
        crash before their first record was written) as long ago, except those in `keep` (live again: a kill that
        failed); how many (the ones deleted to keep within `max_total_bytes` are not counted). One copy that
        cannot be deleted does not stop the others."""
        removed = 0
        horizon = self._clock() - self.retention
        for sandbox_id in self.sandbox_ids():
            if sandbox_id in keep:
                continue
            try:
                sandbox = self._sandbox(sandbox_id)
                ended_at = (self.root / sandbox_id).stat().st_mtime if sandbox is None else sandbox.ended_at
                if ended_at is not None and ended_at <= horizon:
                    self._remove(sandbox_id)
                    removed += 1
            except OSError as exc:
                _log.warning("sandbox %s: its sessions' copy could not be pruned: %s", sandbox_id, exc)
        self._make_room(0, spare=keep)  # the copies of a server restarted with a smaller `max_total_bytes`
        return removed

    def _full(self, sandbox_id: str, limit: str) -> bool:
        self._mark(sandbox_id, truncated=True)
        _log.warning("sandbox %s: its sessions' copy is full (%s): later events not kept", sandbox_id, limit)
        return False

    def _session_count(self, sandbox_id: str) -> int:
        directory = self.root / sandbox_id / "sessions"
        return sum(1 for _ in directory.iterdir()) if directory.is_dir() else 0

    def _forget(self, sandbox_id: str) -> None:
        """Drop the indexes of the sandbox's logs (read again from disk when asked for)."""
        for key in [key for key in self._logs if key[0] == sandbox_id]:
            del self._logs[key]
        self._sizes.pop(sandbox_id, None)

    def _remove(self, sandbox_id: str) -> None:
        size = self.size(sandbox_id) if self._total is not None else 0
        self._forget(sandbox_id)
        shutil.rmtree(self.root / sandbox_id, ignore_errors=True)
        if self._total is not None and not (self.root / sandbox_id).exists():
            self._total -= size
        else:
            self._total = None  # counted again when asked for: what could not be deleted still counts

    def _mark(self, sandbox_id: str, **changes: object) -> None:
        sandbox = self._sandbox(sandbox_id)
        if sandbox is not None:
            _write(self.root / sandbox_id / "sandbox.json", msgspec.structs.replace(sandbox, **changes))

    def _sandbox(self, sandbox_id: str) -> ArchivedSandbox | None:
        return _read(self.root / sandbox_id / "sandbox.json", ArchivedSandbox)

    def _infos(self, sandbox_id: str, sandbox: ArchivedSandbox) -> list[SessionInfo]:
        directory = self.root / sandbox_id / "sessions"
        names = [path.name for path in directory.iterdir()] if directory.is_dir() else []
        infos = (self._info(sandbox_id, name, sandbox) for name in names if _SESSION_ID.fullmatch(name))
        return [info for info in infos if info is not None]

    def _info(self, sandbox_id: str, session_id: str, sandbox: ArchivedSandbox) -> SessionInfo | None:
        """The session as last listed; once its sandbox ended, as ended: nothing of it is still going on."""
        info = _read(self._session_dir(sandbox_id, session_id) / "info.json", SessionInfo)
        if info is None or sandbox.ended_at is None:
            return info
        return msgspec.structs.replace(info, ended=True, turn_active=False, pending_permissions=[])

    def _session_dir(self, sandbox_id: str, session_id: str) -> Path:
        return self.root / sandbox_id / "sessions" / session_id

    def _log(self, sandbox_id: str, session_id: str) -> EventLog:
        key = (sandbox_id, session_id)
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = EventLog(str(self._session_dir(sandbox_id, session_id) / "events.jsonl"))
        return log


def _read(path: Path, kind: type[_T]) -> _T | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except FileNotFoundError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        _log.warning("%s: unreadable, skipped: %s", path, exc)
        return None


def _write(path: Path, record: bytes | msgspec.Struct) -> None:
    """Replace `path` whole and durably (a reader never sees half of it, nor an empty file after a crash)."""
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as file:
        file.write(record if isinstance(record, bytes) else msgspec.json.encode(record))
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
