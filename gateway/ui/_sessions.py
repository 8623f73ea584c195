"""Server-side sessions: the browser holds only an opaque random id; the API key never leaves the sign-in form.

A session maps the id to the key's id (the owner of the sandboxes), a per-session CSRF token, and its expiry:
`lifetime` after sign-in at the latest, and `idle` after its last request. Ids are stored as SHA-256 digests,
so the table itself does not hold usable cookies. Sessions live in this process's memory: a restart signs
everyone out, which costs a sign-in and leaks nothing.

The store is shared by every request, on the event loop only (no locks needed).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable

import msgspec

__all__ = ["Session", "SessionStore"]


class Session(msgspec.Struct, kw_only=True):
    """One signed-in browser. Mutable: `last_seen` and `key_checked_at` move as it is used."""

    owner: str  # the API key's id
    key_name: str  # the key's name, for the header
    csrf: str  # sent back by the page on every state-changing request
    created_at: float
    last_seen: float
    key_checked_at: float  # when the key was last seen to exist (a revoked key ends its sessions)


class SessionStore:
    """Opaque session ids → sessions, with an absolute and an idle expiry and a cap on how many are kept."""

    def __init__(
        self,
        *,
        lifetime: float = 12 * 3600.0,
        idle: float = 2 * 3600.0,
        max_sessions: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if lifetime <= 0 or idle <= 0 or max_sessions < 1:
            raise ValueError("session lifetime and idle timeout must be > 0, and max_sessions >= 1")
        self.lifetime = lifetime
        self._idle = idle
        self._max = max_sessions
        self._clock = clock
        self._sessions: dict[str, Session] = {}  # sha256(id) -> session; oldest sign-in first (dict order)

    def create(self, owner: str, key_name: str) -> str:
        """Open a session for `owner` and return its id (for the cookie; not kept here)."""
        now = self._clock()
        self._purge(now)
        while len(self._sessions) >= self._max:
            del self._sessions[next(iter(self._sessions))]  # the oldest sign-in gives way
        session_id = secrets.token_urlsafe(32)
        self._sessions[_digest(session_id)] = Session(
            owner=owner, key_name=key_name, csrf=secrets.token_urlsafe(32), created_at=now, last_seen=now,
            key_checked_at=now,
        )  # fmt: skip
        return session_id

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (its idle clock restarts), or None."""
        if not session_id:
            return None
        digest = _digest(session_id)
        session = self._sessions.get(digest)
        now = self._clock()
        if session is None:
            return None
        if self._expired(session, now):
            del self._sessions[digest]
            return None
        session.last_seen = now
        return session

    def drop(self, session_id: str | None) -> None:
        """Sign out: the id stops working at once."""
        if session_id:
            self._sessions.pop(_digest(session_id), None)

    def drop_owner(self, owner: str) -> None:
        """End every session of a key (it was revoked)."""
        self._sessions = {d: s for d, s in self._sessions.items() if s.owner != owner}

    def __len__(self) -> int:
        return len(self._sessions)

    def _expired(self, session: Session, now: float) -> bool:
        return now >= session.created_at + self.lifetime or now >= session.last_seen + self._idle

    def _purge(self, now: float) -> None:
        self._sessions = {d: s for d, s in self._sessions.items() if not self._expired(s, now)}


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()
