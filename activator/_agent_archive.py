"""The control plane's copy of every sandbox's coding-agent sessions, kept after the sandbox is gone.

`activator._agent_mirror` fills it from each sandbox's agent server; the control-plane API, the MCP tools and the
web UI read it once the sandbox is killed (and the UI's list of sessions across sandboxes at any time). A session's
events keep their sequence numbers, so an offset means the same event here as in the sandbox. On disk, under
the data dir:

    agent-sessions/<sandbox id>/sandbox.json                 whose it is (owner, template), when it ended
    agent-sessions/<sandbox id>/sessions/<session id>/info.json       the session as the sandbox last listed it
    agent-sessions/<sandbox id>/sessions/<session id>/events.jsonl    its events, one a line (`executor.event_log`)

Limits: a sandbox's copy stops growing at `max_bytes` (it is marked `truncated`: the events kept are the first
ones, in order); `retention` seconds after the sandbox ended the whole copy is deleted (0: at once).
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
from executor.agent_api import SESSION_ID_PATTERN, SessionInfo, UniversalEvent
from executor.event_log import EventLog

__all__ = ["AGENT_SESSION_RETENTION", "DEFAULT_MAX_BYTES", "AgentArchive", "ArchivedSandbox", "ArchivedSession"]

AGENT_SESSION_RETENTION = 7 * 86_400.0  # seconds a killed sandbox's sessions stay readable
DEFAULT_MAX_BYTES = 256 << 20  # of events copied per sandbox
_SESSION_ID = re.compile(SESSION_ID_PATTERN)
_SANDBOX_ID = re.compile(r"[a-z0-9]{1,64}")  # `new_sandbox_id`
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class ArchivedSandbox(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    owner: str  # the API key's id: no other key reads the copy
    template: str
    ended_at: float | None = None  # unix seconds it was killed (or found gone); retention counts from it
    truncated: bool = False  # the copy reached `max_bytes`: later events were not copied


class ArchivedSession(NamedTuple):
    sandbox_id: str
    sandbox: ArchivedSandbox
    info: SessionInfo


class AgentArchive:
    """The copies under `root`; every method is synchronous (small files, one write each)."""

    def __init__(
        self,
        root: Path,
        *,
        retention: float = AGENT_SESSION_RETENTION,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = root
        self.retention = retention
        self.max_bytes = max_bytes
        self._clock = clock
        self._logs: dict[tuple[str, str], EventLog] = {}  # open indexes of the logs written or read lately
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
        self.sandbox(owner, sandbox_id)
        return _newest_first(self._infos(sandbox_id))

    def across(self, owner: str) -> list[ArchivedSession]:
        """Every session kept of `owner`'s sandboxes, live or ended, newest first."""
        found: list[ArchivedSession] = []
        for sandbox_id in self.sandbox_ids():
            sandbox = self._sandbox(sandbox_id)
            if sandbox is not None and sandbox.owner == owner:
                found += (ArchivedSession(sandbox_id, sandbox, info) for info in self._infos(sandbox_id))
        return sorted(found, key=lambda kept: kept.info.created_at, reverse=True)

    def info(self, owner: str, sandbox_id: str, session_id: str) -> SessionInfo:
        self.sandbox(owner, sandbox_id)
        info = self._info(sandbox_id, session_id) if _SESSION_ID.fullmatch(session_id) else None
        if info is None:
            raise SandboxNotFound(f"no session {session_id} is kept of sandbox {sandbox_id}")
        return info

    def events(self, owner: str, sandbox_id: str, session_id: str, offset: int, limit: int) -> tuple[list[bytes], bool]:
        """The kept events with sequence > `offset` (at most `limit`, as JSON), and whether more follow."""
        self.info(owner, sandbox_id, session_id)
        records = self._log(sandbox_id, session_id).read(offset, limit + 1)
        return records[:limit], len(records) > limit

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
        sandbox = self._sandbox(sandbox_id) or ArchivedSandbox(owner=owner, template=template)
        directory = self._session_dir(sandbox_id, info.session_id)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if sandbox != self._sandbox(sandbox_id):
            _write(self.root / sandbox_id / "sandbox.json", msgspec.json.encode(sandbox))
        log = self._log(sandbox_id, info.session_id)
        used, full = self.size(sandbox_id), False
        for event in events:
            if event.sequence != len(log) + 1:
                raise ValueError(f"session {info.session_id}: event {event.sequence} does not follow {len(log)}")
            line = msgspec.json.encode(event)
            used += len(line) + 1
            if used > self.max_bytes:
                full = True
                self._mark(sandbox_id, truncated=True)
                _log.warning("sandbox %s: its sessions' copy is full (%d bytes): later events not kept", sandbox_id,
                             self.max_bytes)  # fmt: skip
                break
            log.append(line)
        _write(directory / "info.json", msgspec.json.encode(info))
        return not full

    def size(self, sandbox_id: str) -> int:
        """Bytes of events kept of the sandbox."""
        directory = self.root / sandbox_id
        return sum(path.stat().st_size for path in directory.glob("sessions/*/events.jsonl"))

    def ended(self, sandbox_id: str) -> None:
        """The sandbox is gone: retention counts from now (or its copy goes at once, with no retention)."""
        sandbox = self._sandbox(sandbox_id)
        if sandbox is not None and sandbox.ended_at is None:
            self._mark(sandbox_id, ended_at=self._clock())
        self._forget(sandbox_id)
        if self.retention == 0:
            self._remove(sandbox_id)

    def full(self, sandbox_id: str) -> bool:
        """Whether the sandbox's copy reached `max_bytes` (nothing more is copied)."""
        sandbox = self._sandbox(sandbox_id)
        return sandbox is not None and sandbox.truncated

    def prune(self, *, keep: Collection[str] = ()) -> int:
        """Delete the copies of sandboxes that ended over `retention` seconds ago, except those in `keep` (live
        again: a kill that failed); how many."""
        removed = 0
        horizon = self._clock() - self.retention
        for sandbox_id in self.sandbox_ids():
            sandbox = None if sandbox_id in keep else self._sandbox(sandbox_id)
            if sandbox is not None and sandbox.ended_at is not None and sandbox.ended_at <= horizon:
                self._remove(sandbox_id)
                removed += 1
        return removed

    def _forget(self, sandbox_id: str) -> None:
        """Drop the indexes of the sandbox's logs (read again from disk when asked for)."""
        for key in [key for key in self._logs if key[0] == sandbox_id]:
            del self._logs[key]

    def _remove(self, sandbox_id: str) -> None:
        self._forget(sandbox_id)
        shutil.rmtree(self.root / sandbox_id, ignore_errors=True)

    def _mark(self, sandbox_id: str, **changes: object) -> None:
        sandbox = self._sandbox(sandbox_id)
        if sandbox is not None:
            changed = msgspec.structs.replace(sandbox, **changes)
            _write(self.root / sandbox_id / "sandbox.json", msgspec.json.encode(changed))

    def _sandbox(self, sandbox_id: str) -> ArchivedSandbox | None:
        return _read(self.root / sandbox_id / "sandbox.json", ArchivedSandbox)

    def _infos(self, sandbox_id: str) -> list[SessionInfo]:
        directory = self.root / sandbox_id / "sessions"
        names = [path.name for path in directory.iterdir()] if directory.is_dir() else []
        infos = (self._info(sandbox_id, name) for name in names if _SESSION_ID.fullmatch(name))
        return [info for info in infos if info is not None]

    def _info(self, sandbox_id: str, session_id: str) -> SessionInfo | None:
        return _read(self._session_dir(sandbox_id, session_id) / "info.json", SessionInfo)

    def _session_dir(self, sandbox_id: str, session_id: str) -> Path:
        return self.root / sandbox_id / "sessions" / session_id

    def _log(self, sandbox_id: str, session_id: str) -> EventLog:
        key = (sandbox_id, session_id)
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = EventLog(str(self._session_dir(sandbox_id, session_id) / "events.jsonl"))
        return log


def _newest_first(infos: list[SessionInfo]) -> list[SessionInfo]:
    return sorted(infos, key=lambda info: info.created_at, reverse=True)


def _read(path: Path, kind: type[_T]) -> _T | None:
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except FileNotFoundError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        _log.warning("%s: unreadable, skipped: %s", path, exc)
        return None


def _write(path: Path, data: bytes) -> None:
    """Replace `path` whole (a reader never sees half of it)."""
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as file:
        file.write(data)
    os.replace(partial, path)
