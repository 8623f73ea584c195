"""Keeps the control plane's copy of the coding-agent sessions (`AgentArchive`) up to date with the sandboxes.

Pulled by the server, not pushed by the sandbox: a sandbox cannot reach the control plane (its egress denies the
server's addresses), and a pull needs no credential inside the sandbox. Which sandboxes are followed: those whose
agent port (2468) was opened through the gateway, MCP or the web UI, those the server already has a copy of, and
those a sweep (every minute) finds sessions in, e.g. ones started from inside the sandbox. When: every `interval`
seconds while a followed sandbox runs (`GET /v1/sessions`, then the events of the sessions whose listing changed,
from the offset the copy has), and once more before it is paused, snapshotted or killed, so the copy holds every
event up to then; a running sandbox not followed is asked once before its kill (the last chance to find its
sessions). A paused or snapshotted sandbox makes no events; after a resume the next pull copies the backlog, as
after a network gap. The pulls take the runtime's socket straight: they neither wake a sandbox nor
count as its activity, so the idle policy sees only real traffic.

Bounds: one pull of a sandbox at a time, each within `deadline` seconds (waiting for the one before included), at
most `_PARALLEL` periodic pulls at once; a session the copy cannot take (events out of order, undecodable) is
skipped without holding back the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

from activator._agent_archive import AgentArchive
from activator._mcp._agent_port import AgentPort, session_path
from activator._mcp._errors import ToolError
from activator._records import SandboxRecord, SandboxState
from executor.agent_api import AGENT_PORT, EventPage, SessionInfo, SessionList

__all__ = ["PULL_DEADLINE", "PULL_INTERVAL", "AgentMirror", "MirrorSource"]

PULL_INTERVAL = 1.0  # seconds between two pulls of a running sandbox's sessions
PULL_DEADLINE = 5.0  # seconds one pull may take (also what a pause or kill waits for at most)
_PAGE = 1_000  # events a request
_PARALLEL = 8  # periodic pulls at once (a pull before a pause or kill never waits for them)
_SWEEP_EVERY = 60.0  # seconds between two passes over the copies (ended sandboxes, retention, new sessions)
_DISCOVER_DEADLINE = 1.0  # seconds a kill waits for a sandbox nobody followed to list its sessions
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
        may_hold_sessions: Callable[[str], bool] = lambda _sandbox_id: True,
    ) -> None:
        """`may_hold_sessions(sandbox_id)`: the runtime's cheap look at whether the sandbox has any session at all,
        so that the kill of one nobody followed asks it only then."""
        self.archive = archive
        self._may_hold_sessions = may_hold_sessions
        self._open_socket = open_socket
        self._interval = interval
        self._deadline = deadline
        self._tracked: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}  # one pull of a sandbox at a time: its copy is appended in order
        self._seen: dict[tuple[str, str], SessionInfo] = {}  # (sandbox, session) -> the listing last copied
        self._failing: set[str] = set()  # sandboxes whose last pull failed (logged once until one succeeds)
        self._pulling: dict[str, asyncio.Task[None]] = {}  # the periodic pull of each sandbox under way
        self._parallel = asyncio.Semaphore(_PARALLEL)

    def opened(self, sandbox_id: str, port: int) -> None:
        """A connection to the sandbox's `port` was opened for a client: its agent port makes it followed."""
        if port == AGENT_PORT:
            self._tracked.add(sandbox_id)

    async def halting(self, before: SandboxRecord | None, after: SandboxRecord) -> None:
        """Before a pause, snapshot or kill: copy what a followed running sandbox has. Before the kill of one not
        followed, ask it once (within `_DISCOVER_DEADLINE`) if the runtime sees a session in its files: sessions
        started inside it since the last sweep would be lost for good, where a paused or snapshotted one is still
        found by a sweep once it is resumed."""
        if before is None or before.state is not SandboxState.RUNNING:
            return
        if before.id in self._tracked:
            await self._pull_quietly(before)
        elif after.state is SandboxState.KILLED and self._may_hold_sessions(before.id):
            with contextlib.suppress(Exception):  # no agent server to ask: nothing to copy, nothing to say
                async with asyncio.timeout(_DISCOVER_DEADLINE):
                    await self.pull(before)

    def halted(self, record: SandboxRecord) -> None:
        """After the runtime paused, snapshotted or killed it: a kill ends the sandbox's copy."""
        if record.state is SandboxState.KILLED:
            self._drop(record.id)
            try:
                self.archive.ended(record.id)
            except OSError as exc:  # the next sweep ends it
                _log.warning("sandbox %s: its sessions' copy could not be ended: %s", record.id, exc)

    async def run(self, source: MirrorSource) -> None:
        """Pull the followed running sandboxes every `interval` seconds, and sweep the copies now and then; until
        cancelled."""
        self._tracked.update(sandbox_id for sandbox_id in self.archive.sandbox_ids() if sandbox_id in source.live)
        swept = float("-inf")
        try:
            while True:
                live = source.live
                running = {
                    sandbox_id: record for sandbox_id, record in live.items()
                    if record.state is SandboxState.RUNNING and not source.leaving(sandbox_id)
                }  # fmt: skip
                if time.monotonic() - swept >= _SWEEP_EVERY:
                    try:
                        self._sweep(live)
                    except OSError as exc:  # the data dir itself: said, and tried again at the next sweep
                        _log.warning("the coding-agent sessions' copies were not swept: %s", exc)
                    self._start(running.values(), discover=True)  # finds sessions the gateway never carried
                    swept = time.monotonic()
                self._start(running[sandbox_id] for sandbox_id in self._tracked & running.keys())
                await asyncio.sleep(self._interval)
        finally:
            for task in self._pulling.values():
                task.cancel()

    async def pull(self, record: SandboxRecord) -> bool:
        """Copy the sandbox's new events and changed listings; whether it has sessions. Raises what reaching its
        agent server raises."""
        async with asyncio.timeout(self._deadline), self._locks.setdefault(record.id, asyncio.Lock()):
            if self.archive.full(record.id):
                return True
            port = AgentPort(lambda: self._open_socket(record.id, AGENT_PORT), record.access_token)
            listing = await port.decoded(SessionList, "GET", "/v1/sessions")
            for info in listing.sessions:
                key = (record.id, info.session_id)
                if self._seen.get(key) == info:
                    continue
                try:
                    copied = await self._copy(port, record, info)
                except (ValueError, ToolError) as exc:  # this session only (refused, undecodable, out of order): go on
                    _log.warning("sandbox %s: session %s not copied: %s", record.id, info.session_id, exc)
                    continue
                if not copied:
                    break  # full: nothing more of this sandbox is copied
                self._seen[key] = info
            return bool(listing.sessions)

    async def _copy(self, port: AgentPort, record: SandboxRecord, info: SessionInfo) -> bool:
        """Copy the session's events past those kept, page by page; False when the copy is full."""
        kept = self.archive.length(record.id, info.session_id)
        while True:
            path = f"{session_path(info.session_id)}/events?offset={kept}&limit={_PAGE}"
            page = await port.decoded(EventPage, "GET", path)
            if not self.archive.keep(record.id, record.owner, record.template, info, page.events):
                return False
            kept += len(page.events)
            if not page.has_more or not page.events:
                return True

    def _start(self, records: Iterable[SandboxRecord], *, discover: bool = False) -> None:
        """Start a periodic pull of each sandbox that has none under way; `discover`: follow it if it has sessions."""
        for record in records:
            if record.id not in self._pulling:
                task = asyncio.create_task(self._periodic(record, discover=discover), name=record.id)
                self._pulling[record.id] = task
                task.add_done_callback(lambda done: self._pulling.pop(done.get_name(), None))

    async def _periodic(self, record: SandboxRecord, *, discover: bool) -> None:
        async with self._parallel:
            if discover and record.id not in self._tracked:
                with contextlib.suppress(Exception):  # no agent server to ask: nothing to copy, nothing to say
                    if await self.pull(record):
                        self._tracked.add(record.id)
            else:
                await self._pull_quietly(record)

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

    def _drop(self, sandbox_id: str) -> None:
        """Forget what is held in memory of the sandbox."""
        self._tracked.discard(sandbox_id)
        self._locks.pop(sandbox_id, None)
        self._failing.discard(sandbox_id)
        for key in [key for key in self._seen if key[0] == sandbox_id]:
            del self._seen[key]

    def _sweep(self, live: Mapping[str, SandboxRecord]) -> None:
        """Copies of sandboxes gone without a kill seen here (`cleanup`, a server crash) are ended, and forgotten
        in memory; expired ones deleted."""
        for sandbox_id in {*self._tracked, *self._locks, *self.archive.sandbox_ids()} - live.keys():
            self._drop(sandbox_id)
            try:
                self.archive.ended(sandbox_id)
            except OSError as exc:
                _log.warning("sandbox %s: its sessions' copy could not be ended: %s", sandbox_id, exc)
        self.archive.prune(keep=live.keys())
