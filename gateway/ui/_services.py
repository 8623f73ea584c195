"""What the UI needs from the rest of the server, declared here as narrow Protocols the platform's objects satisfy.

The UI holds no sandbox state of its own: every page and stream asks the activator again, so what it shows is
what the E2B API would answer at that moment, with the internal state (paused by the idle policy, snapshotted)
shown too.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import msgspec

from activator import (
    ActivatorSettings,
    AgentArchive,
    ApiKey,
    LogLine,
    Page,
    SandboxRecord,
    SandboxState,
    TemplateBuilds,
    TemplateCatalog,
)
from pool import SandboxStats

__all__ = ["KeyVerifier", "PoolStats", "UiActivator", "UiServices"]

PoolStats = Callable[[], Mapping[str, Any]]  # template -> its warm pool's figures (`pool.WarmPoolStats`)


class UiActivator(Protocol):
    """The lifecycle operations the UI calls, always on behalf of the signed-in key (`owner`)."""

    @property
    def settings(self) -> ActivatorSettings: ...

    @property
    def catalog(self) -> TemplateCatalog: ...

    @property
    def template_builds(self) -> TemplateBuilds: ...

    @property
    def agent_archive(self) -> AgentArchive | None: ...

    @property
    def live(self) -> Mapping[str, SandboxRecord]: ...

    def get(self, owner: str, sandbox_id: str) -> SandboxRecord: ...

    async def metrics(self, owner: str, sandbox_id: str) -> tuple[float, SandboxStats | None]: ...

    def logs(self, owner: str, sandbox_id: str) -> list[LogLine]: ...

    async def pause(self, owner: str, sandbox_id: str) -> None: ...

    async def connect(self, owner: str, sandbox_id: str, seconds: float) -> tuple[SandboxRecord, bool]: ...

    async def kill(self, owner: str, sandbox_id: str) -> None: ...

    async def refresh(self, owner: str, sandbox_id: str, seconds: float) -> None: ...

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket: ...

    def touch(self, sandbox_id: str) -> None: ...

    # Last, so that `list` in the annotations above is still the builtin.
    async def list(
        self,
        owner: str,
        *,
        states: Collection[SandboxState] = ...,
        metadata: Mapping[str, str] | None = None,
        limit: int = 100,
        next_token: str | None = None,
    ) -> Page: ...


class KeyVerifier(Protocol):
    """Checks a key at sign-in, and at every request that the key a session was opened with is not revoked."""

    async def check(self, raw: str, client: str | None) -> str | None: ...

    async def active(self, key_id: str) -> bool: ...

    async def get(self, key_id: str) -> ApiKey | None: ...


class UiServices(msgspec.Struct, frozen=True, kw_only=True):
    """The platform's parts the UI is built on; `ui_router(services)` takes one."""

    activator: UiActivator
    keys: KeyVerifier
    # The warm pools' figures, when the server runs warm pools; the Pools page says "no warm pool" otherwise.
    pool_stats: PoolStats | None = None
    # When the sandbox last saw traffic (clock seconds, 0 if never since start); without it the idle time shown
    # is the time since the sandbox last started or resumed.
    last_activity: Callable[[str], float] | None = None
