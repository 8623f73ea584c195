"""Server-side sessions: the browser holds only an opaque random id; the API key never leaves the sign-in form.

A session maps the id to the key's id (the owner of the sandboxes), a per-session CSRF token, and its expiry:
`lifetime` after sign-in at the latest, and `idle` after its last request. Ids are stored as SHA-256 digests,
so the table itself does not hold usable cookies.

`Sessions` is what the UI asks of a session table. `SessionStore` keeps it in this process's memory (a replica
alone: a restart signs everyone out, which costs a sign-in and leaks nothing); `SharedSessionStore`
(`gateway.ui._shared_sessions`) keeps it in the Redis the replicas share.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Protocol

import msgspec

__all__ = ["Session", "SessionStore", "Sessions", "check_limits", "expires_at", "new_session", "session_digest"]


class Session(msgspec.Struct, kw_only=True):
    """One signed-in browser. Mutable: `last_seen` moves as it is used.

    Kept in Redis as JSON by `SharedSessionStore`: a new field must have a default."""

    owner: str  # the API key's id
    key_name: str  # the key's name, for the header
    csrf: str  # sent back by the page on every state-changing request
    created_at: float
    last_seen: float


class Sessions(Protocol):
    """The session table the UI uses. None of the methods raises because a shared medium is unreachable."""

    @property
    def lifetime(self) -> float:
        """Seconds a session lasts at most (the cookie's max-age)."""
        ...

    async def create(self, owner: str, key_name: str) -> str:
        """Open a session for `owner` and return its id (for the cookie; not kept)."""
        ...

    async def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (its idle clock restarts), or None."""
        ...

    async def drop(self, session_id: str | None) -> None:
        """Sign out: the id stops working at once."""

    async def drop_owner(self, owner: str) -> None:
        """End every session of a key (it was revoked)."""


class SessionStore:
    """Sessions in this process's memory, with an absolute and an idle expiry and a cap on how many are kept.

    Shared by every request, on the event loop only (no awaits inside a method, so no locks needed)."""

    def __init__(
        self,
        *,
        lifetime: float = 12 * 3600.0,
        idle: float = 2 * 3600.0,
        max_sessions: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_limits(lifetime, idle, max_sessions)
        self._lifetime = lifetime
        self._idle = idle
        self._max = max_sessions
        self._clock = clock
        self._sessions: dict[str, Session] = {}  # sha256(id) -> session; oldest sign-in first (dict order)

    @property
    def lifetime(self) -> float:
        return self._lifetime

    async def create(self, owner: str, key_name: str) -> str:
        now = self._clock()
        self._purge(now)
        while len(self._sessions) >= self._max:
            del self._sessions[next(iter(self._sessions))]  # the oldest sign-in gives way
        session_id, session = new_session(owner, key_name, now)
        self._sessions[session_digest(session_id)] = session
        return session_id

    async def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        digest = session_digest(session_id)
        session = self._sessions.get(digest)
        now = self._clock()
        if session is None:
            return None
        if now >= expires_at(session, self._lifetime, self._idle):
            del self._sessions[digest]
            return None
        session.last_seen = now
        return session

    async def drop(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_digest(session_id), None)

    async def drop_owner(self, owner: str) -> None:
        self._sessions = {d: s for d, s in self._sessions.items() if s.owner != owner}

    def __contains__(self, session_id: object) -> bool:
        """Whether this table holds the id (expired or not): for a shared store, whether it was made here."""
        return isinstance(session_id, str) and session_digest(session_id) in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def _purge(self, now: float) -> None:
        self._sessions = {
            d: s for d, s in self._sessions.items() if now < expires_at(s, self._lifetime, self._idle)
        }  # fmt: skip


def check_limits(lifetime: float, idle: float, max_sessions: int) -> None:
    """ValueError unless the limits make sense (at construction, not on the first sign-in)."""
    if lifetime <= 0 or idle <= 0 or max_sessions < 1:
        raise ValueError("session lifetime and idle timeout must be > 0, and max_sessions >= 1")


def new_session(owner: str, key_name: str, now: float) -> tuple[str, Session]:
    """A fresh random id (256 bits) and its session."""
    session = Session(
        owner=owner, key_name=key_name, csrf=secrets.token_urlsafe(32), created_at=now, last_seen=now,
    )  # fmt: skip
    return secrets.token_urlsafe(32), session


def expires_at(session: Session, lifetime: float, idle: float) -> float:
    """When the session ends unless used again: its absolute expiry or its idle one, whichever comes first."""
    return min(session.created_at + lifetime, session.last_seen + idle)


def session_digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()
