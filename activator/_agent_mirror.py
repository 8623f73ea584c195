"""Keeps the control plane's copy of the coding-agent sessions (`AgentArchive`) up to date with the sandboxes.

Pulled by the server, not pushed by the sandbox: a sandbox cannot reach the control plane (its egress denies the
server's addresses), and a pull needs no credential inside the sandbox. Which sandboxes: those whose agent port
(2468) was opened through the gateway, MCP or the web UI since the server started, and those it already has a copy
of. When: every `interval` seconds while such a sandbox runs (`GET /v1/sessions`, then the events of the sessions
whose listing changed, from the offset the copy has), and once more before the sandbox is paused, snapshotted or
killed, so the copy holds every event up to then. A paused or snapshotted sandbox makes no events; after a resume
the next pull copies the backlog, as after a network gap. The pulls take the runtime's socket straight: they
neither wake a sandbox nor count as its activity, so the idle policy sees only real traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from activator._agent_archive import AgentArchive
from activator._mcp._agent_port import AgentPort, session_path
from activator._records import SandboxRecord, SandboxState
from executor.agent_api import AGENT_PORT, EventPage, SessionInfo, SessionList

__all__ = ["PULL_DEADLINE", "PULL_INTERVAL", "AgentMirror", "MirrorSource"]

PULL_INTERVAL = 1.0  # seconds between two pulls of a running sandbox's sessions
PULL_DEADLINE = 5.0  # seconds one pull may take (also what a pause or kill waits for at most)
_PAGE = 1_000  # events a request
_SWEEP_EVERY = 60.0  # seconds between two passes over the copies (ended sandboxes, retention)
_log = logging.getLogger(__name__)


class MirrorSource(Protocol):
    """What the mirror reads of the activator."""

    @property
    def live(self) -> Mapping[str, SandboxRecord]: ...

    def leaving(self, sandbox_id: str) -> bool: ...


class AgentMirror:
    """Copies sessions into `archive`; `open_socket(sandbox_id, port)` is the runtime's."""

    def __init__(
        self,
        archive: AgentArchive,
        open_socket: Callable[[str, int], Awaitable[socket.socket]],
        *,
        interval: float = PULL_INTERVAL,
        deadline: float = PULL_DEADLINE,
    ) -> None:
        self.archive = archive
        self._open_socket = open_socket
        self._interval = interval
        self._deadline = deadline
        self._tracked: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}  # one pull of a sandbox at a time: its copy is appended in order
        self._seen: dict[tuple[str, str], SessionInfo] = {}  # (sandbox, session) -> the listing last copied
        self._failing: set[str] = set()  # sandboxes whose last pull failed (logged once until one succeeds)

    def opened(self, sandbox_id: str, port: int) -> None:
        """A connection to the sandbox's `port` was opened for a client: its agent port makes it followed."""
        if port == AGENT_PORT:
            self._tracked.add(sandbox_id)

    async def halting(self, before: SandboxRecord | None, after: SandboxRecord) -> None:
        """Before a pause, snapshot or kill: copy what a followed running sandbox has; a kill ends its copy."""
        if before is not None and before.state is SandboxState.RUNNING and before.id in self._tracked:
            await self._pull_quietly(before)
        if after.state is SandboxState.KILLED:
            self._tracked.discard(after.id)
            self._locks.pop(after.id, None)
            self._failing.discard(after.id)
            for key in [key for key in self._seen if key[0] == after.id]:
                del self._seen[key]
            self.archive.ended(after.id)

    async def run(self, source: MirrorSource) -> None:
        """Pull the followed running sandboxes every `interval` seconds, and sweep the copies now and then; until
        cancelled."""
        self._tracked.update(sandbox_id for sandbox_id in self.archive.sandbox_ids() if sandbox_id in source.live)
        swept = float("-inf")
        while True:
            live = source.live
            if time.monotonic() - swept >= _SWEEP_EVERY:
                self._sweep(live)
                swept = time.monotonic()
            self._tracked &= live.keys()
            running = [live[sandbox_id] for sandbox_id in self._tracked]
            await asyncio.gather(*(
                self._pull_quietly(record) for record in running
                if record.state is SandboxState.RUNNING and not source.leaving(record.id)
            ))  # fmt: skip
            await asyncio.sleep(self._interval)

    async def pull(self, record: SandboxRecord) -> None:
        """Copy the sandbox's new events and changed listings; raises what reaching its agent server raises."""
        lock = self._locks.setdefault(record.id, asyncio.Lock())
        async with lock, asyncio.timeout(self._deadline):
            if self.archive.full(record.id):
                return
            port = AgentPort(lambda: self._open_socket(record.id, AGENT_PORT), record.access_token)
            listing = await port.decoded(SessionList, "GET", "/v1/sessions")
            for info in listing.sessions:
                key = (record.id, info.session_id)
                if self._seen.get(key) == info:
                    continue
                kept = self.archive.length(record.id, info.session_id)
                while True:
                    path = f"{session_path(info.session_id)}/events?offset={kept}&limit={_PAGE}"
                    page = await port.decoded(EventPage, "GET", path)
                    if not self.archive.keep(record.id, record.owner, record.template, info, page.events):
                        return  # full: nothing more of this sandbox is copied
                    kept += len(page.events)
                    if not page.has_more or not page.events:
                        break
                self._seen[key] = info

    async def _pull_quietly(self, record: SandboxRecord) -> None:
        """`pull`, its failure logged (once until a pull succeeds again): the mirror never stops a transition."""
        try:
            await self.pull(record)
        except Exception as exc:  # a sandbox's agent server is not ours to trust: whatever it does, we go on
            if record.id not in self._failing:
                _log.warning("sandbox %s: its coding-agent sessions were not copied: %s", record.id, exc or type(exc))
            self._failing.add(record.id)
        else:
            self._failing.discard(record.id)

    def _sweep(self, live: Mapping[str, SandboxRecord]) -> None:
        """Copies of sandboxes gone without a kill seen here (`cleanup`, a server crash) are ended; expired ones
        deleted."""
        with contextlib.suppress(OSError):
            for sandbox_id in self.archive.sandbox_ids():
                if sandbox_id not in live:
                    self.archive.ended(sandbox_id)
            self.archive.prune(keep=live.keys())
