"""What gateway replicas share, as one narrow interface the activator depends on.

Alone (no `--redis-url`) a replica needs none of it: `SoloCoordinator` does nothing, cheaply. With Redis,
`RedisCoordinator` (`activator._redis_coordination`) shares locks, change notices and activity, one module
each, over one supervised connection that lets each replica go on alone while Redis is down.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

__all__ = ["Coordinator", "SoloCoordinator"]


class Coordinator(Protocol):
    """What gateway replicas share. Without --redis-url: `SoloCoordinator` (this process alone).

    None of the methods raises because the shared medium is unreachable: a coordinator that loses it goes on
    as if alone (see `RedisCoordinator`).
    """

    shared: bool  # True when other replicas may exist (the machine then re-reads records from the store)

    async def start(self, on_changed: Callable[[str], None]) -> None:
        """Begin listening; `on_changed(sandbox_id)` runs for changes other replicas publish (not our own)."""

    async def close(self) -> None:
        """Stop the background work and release what was held."""

    def sandbox_lock(self, sandbox_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held around one activation or transition of the sandbox, exclusive across replicas."""
        ...

    async def publish_changed(self, sandbox_id: str) -> None:
        """Tell the others the sandbox's record changed (route-cache invalidation, "sandbox ready")."""

    def note_activity(self, sandbox_id: str, at: float) -> None:
        """Traffic at `at` (epoch seconds, `time.time()`): cheap, sync, batched to the others."""

    async def activity(self) -> dict[str, float]:
        """The latest activity per sandbox (epoch seconds) across all replicas, for the leader's idle policy."""
        ...


class SoloCoordinator:
    """The coordinator of a replica that is alone: every sandbox lock is free, nobody to tell anything."""

    shared = False

    async def start(self, on_changed: Callable[[str], None]) -> None:
        pass

    async def close(self) -> None:
        pass

    def sandbox_lock(self, sandbox_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()

    async def publish_changed(self, sandbox_id: str) -> None:
        pass

    def note_activity(self, sandbox_id: str, at: float) -> None:
        pass

    async def activity(self) -> dict[str, float]:
        """Nothing: alone, the replica's own `Activity` is the whole truth."""
        return {}
