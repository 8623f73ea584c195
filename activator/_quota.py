"""Per-key limits: how many sandboxes one API key holds at once, and how much memory and how many vCPUs they declare.

Every live sandbox counts, whatever its state: running, paused (frozen, its memory kept) and snapshotted (at zero).
E2B counts running + paused sandboxes against a team's concurrency, and E2B's paused is our snapshotted; a
snapshotted sandbox keeps its share too because traffic or an API call may wake it at any moment, and a wake-up
must never be refused for want of room. So only a create is admitted here: a resume or a connect brings back a
sandbox that already counts.

A create reserves its share under its key's lock before anything starts and keeps the reservation until its record
is live (or the create failed), so concurrent creates of one key never overshoot: each sees the others' shares.
The key's limits are read from the store at every create, so `agent-sandbox keys update` applies to the next one.
Among replicas (`--redis-url`) each counts the sandboxes it knows, which includes the others' once their notices
arrive: creates of one key sent to several replicas in the same instant may pass the limit by those in flight.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import NamedTuple

from activator._errors import QuotaExceeded
from activator._records import KeyLimits, SandboxRecord

__all__ = ["DEFAULT_KEY_LIMITS", "KeyQuota"]

# The server's limits where a key's own leave them to it (`serve --key-max-*`): 100 sandboxes is E2B Pro's
# concurrency. Declared memory and vCPUs are ceilings, not use (a sandbox rarely fills its template's), so they are
# unlimited by default and the parent cgroup's ceiling (`serve --sandboxes-memory-max`) bounds what is really used.
DEFAULT_KEY_LIMITS = KeyLimits(max_sandboxes=100, max_memory_mb=0, max_vcpus=0)


class Share(NamedTuple):
    """What one sandbox counts against its key: itself, its memory and its vCPUs."""

    sandboxes: int
    memory_mb: int
    vcpus: int

    @classmethod
    def of(cls, record: SandboxRecord) -> Share:
        return cls(1, record.memory_mb, record.cpu_count)


def _total(shares: Iterable[Share]) -> Share:
    listed = list(shares)
    return Share(*(sum(column) for column in zip(*listed, strict=True))) if listed else Share(0, 0, 0)


class KeyQuota:
    """Admits creates against their key's limits (`admit`), one key's admissions at a time."""

    def __init__(
        self,
        limits_of: Callable[[str], Awaitable[KeyLimits]],
        live: Callable[[], Mapping[str, SandboxRecord]],
    ) -> None:
        """`limits_of(owner)` is the key's limits with the server's defaults filled in; `live()` every live record."""
        self._limits_of = limits_of
        self._live = live
        # owner -> the shares of its creates admitted and not yet live (or failed). Changed under the owner's lock
        # on admission; released without it (a removal can only make room).
        self._pending: dict[str, dict[object, Share]] = {}
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    @asynccontextmanager
    async def admit(self, record: SandboxRecord) -> AsyncIterator[None]:
        """Hold `record`'s share for the create's duration; QuotaExceeded (nothing reserved) if it does not fit."""
        owner, token = record.owner, object()
        async with self._lock(owner):
            limits = await self._limits_of(owner)
            held = _total([*self._held(owner), *self._pending.get(owner, {}).values()])
            _refuse_past(limits, held, Share.of(record))
            self._pending.setdefault(owner, {})[token] = Share.of(record)
        try:
            yield
        finally:
            pending = self._pending[owner]
            del pending[token]
            if not pending:
                del self._pending[owner]

    def _held(self, owner: str) -> Iterable[Share]:
        return (Share.of(record) for record in self._live().values() if record.owner == owner)

    def _lock(self, owner: str) -> asyncio.Lock:
        lock = self._locks.get(owner)
        if lock is None:
            lock = self._locks[owner] = asyncio.Lock()
        return lock


def _refuse_past(limits: KeyLimits, held: Share, wanted: Share) -> None:
    """QuotaExceeded in E2B's words for a full team, for the first limit `held + wanted` would pass (0: none)."""
    if limits.max_sandboxes and held.sandboxes + wanted.sandboxes > limits.max_sandboxes:
        raise QuotaExceeded(
            f"you have reached the maximum number of concurrent E2B sandboxes ({limits.max_sandboxes}). If you "
            "need more, ask this server's operator (agent-sandbox keys update --max-sandboxes)"
        )
    if limits.max_memory_mb and held.memory_mb + wanted.memory_mb > limits.max_memory_mb:
        raise QuotaExceeded(
            f"you have reached the maximum memory of concurrent E2B sandboxes ({limits.max_memory_mb} MiB; they "
            f"hold {held.memory_mb} MiB and this one needs {wanted.memory_mb} MiB). If you need more, ask this "
            "server's operator (agent-sandbox keys update --max-memory-mb)"
        )
    if limits.max_vcpus and held.vcpus + wanted.vcpus > limits.max_vcpus:
        raise QuotaExceeded(
            f"you have reached the maximum vCPUs of concurrent E2B sandboxes ({limits.max_vcpus}; they hold "
            f"{held.vcpus} and this one needs {wanted.vcpus}). If you need more, ask this server's operator "
            "(agent-sandbox keys update --max-vcpus)"
        )
