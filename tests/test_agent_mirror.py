"""The mirror that fills the control plane's copy of coding-agent sessions (`AgentMirror`), against a scripted agent
server on loopback (the real one runs in `tests/test_agent_sessions_kept.py`): it copies page after page and then
only what is new, copies a followed sandbox once more before it halts and ends its copy at a kill, asks nothing of
a sandbox nobody used until a sweep finds sessions in it, and neither a dead, lying nor hung agent server stops a
transition or holds back the other sessions."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from activator import AgentArchive, AgentMirror, SandboxRecord, SandboxState
from executor.agent_api import AGENT_PORT
from tests.test_activator_fakes import Clock

pytestmark = pytest.mark.anyio


class ScriptedAgentServer:
    """`GET /v1/sessions` and `GET /v1/sessions/{id}/events` over the events in `self.sessions`."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[str] = []
        self.page = 2  # events per page at most, so that a copy takes several pages
        self.lie = False  # answer s1's events out of order
        self.hang = False  # read requests, never answer
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    def add(self, count: int, session_id: str = "s1") -> None:
        events = self.sessions.setdefault(session_id, [])
        for _ in range(count):
            sequence = len(events) + 1
            events.append({
                "event_id": f"e{sequence}", "sequence": sequence, "time": "2026-12-04T08:00:00Z",
                "session_id": session_id, "native_session_id": None, "source": "agent", "synthetic": False,
                "type": "item.delta", "data": {"n": sequence},
            })  # fmt: skip

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        target = head.split(" ", 2)[1]
        self.requests.append(target)
        if self.hang:
            await reader.read()  # until the client gives up
            writer.close()
            return
        url = urlsplit(target)
        if url.path == "/v1/sessions":
            body: Any = {"sessions": [
                {"sessionId": session_id, "agent": "mock", "createdAt": "2026-12-04T08:00:00Z", "ended": False,
                 "eventCount": len(events), "turnActive": True, "pendingPermissions": ["p1"]}
                for session_id, events in self.sessions.items()
            ]}  # fmt: skip
        else:
            session_id = url.path.split("/")[3]
            events = self.sessions[session_id]
            offset = int(parse_qs(url.query)["offset"][0])
            page = events[offset : offset + self.page]
            if self.lie and session_id == "s1":
                page = list(reversed(page))
            body = {"events": page, "hasMore": offset + self.page < len(events)}
        data = json.dumps(body).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data))
        writer.write(data)
        await writer.drain()
        writer.close()


@pytest.fixture
async def agent_server() -> AsyncIterator[ScriptedAgentServer]:
    server = ScriptedAgentServer()
    await server.start()
    yield server
    await server.close()


def record(state: SandboxState = SandboxState.RUNNING) -> SandboxRecord:
    return SandboxRecord(
        id="sbx1", owner="key1", template="base", alias="base", state=state, created_at=0, started_at=0, end_at=0,
        timeout=300, access_token="token",
    )  # fmt: skip


def mirror_of(
    tmp_path: Path,
    agent_server: ScriptedAgentServer,
    *,
    refuse: bool = False,
    deadline: float = 10,
    may_hold_sessions: bool = True,
) -> AgentMirror:
    async def open_socket(sandbox_id: str, port: int) -> socket.socket:
        assert (sandbox_id, port) == ("sbx1", AGENT_PORT)
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", 1 if refuse else agent_server.port))
        except OSError:
            sock.close()
            raise
        return sock

    archive = AgentArchive(tmp_path, clock=Clock())
    return AgentMirror(
        archive, open_socket, interval=0.01, deadline=deadline, may_hold_sessions=lambda _id: may_hold_sessions
    )


async def until(done: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll `done` until it holds: a bounded wait, so that the test fails rather than hangs."""
    for _ in range(int(seconds / 0.01)):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("it did not happen in time")


def kept(mirror: AgentMirror, session_id: str = "s1") -> list[int]:
    return [event.sequence for event in mirror.archive.events("key1", "sbx1", session_id, 0, 100).events]


async def test_a_pull_copies_page_after_page_then_only_what_is_new(
    tmp_path: Path, agent_server: ScriptedAgentServer
) -> None:
    mirror = mirror_of(tmp_path, agent_server)
    agent_server.add(5)
    await mirror.pull(record())
    assert kept(mirror) == [1, 2, 3, 4, 5]
    assert agent_server.requests[1:] == [f"/v1/sessions/s1/events?offset={n}&limit=1000" for n in (0, 2, 4)]
    agent_server.requests.clear()
    await mirror.pull(record())
    assert agent_server.requests == ["/v1/sessions"]  # the listing did not change: no events asked for
    agent_server.add(1)
    await mirror.pull(record())
    assert agent_server.requests[-1] == "/v1/sessions/s1/events?offset=5&limit=1000"
    assert kept(mirror) == [1, 2, 3, 4, 5, 6]


async def test_a_followed_sandbox_is_copied_before_it_halts_and_its_kill_ends_the_copy(
    tmp_path: Path, agent_server: ScriptedAgentServer
) -> None:
    mirror = mirror_of(tmp_path, agent_server)
    agent_server.add(3)
    await mirror.halting(record(), record(SandboxState.PAUSED))  # nobody used its agent port: nothing asked
    assert agent_server.requests == []
    mirror.opened("sbx1", 49999)
    mirror.opened("sbx1", AGENT_PORT)
    await mirror.halting(record(), record(SandboxState.PAUSED))
    assert kept(mirror) == [1, 2, 3]
    assert mirror.archive.sandbox("key1", "sbx1").ended_at is None
    await mirror.halting(record(SandboxState.PAUSED), record(SandboxState.KILLED))
    assert len(agent_server.requests) == 3  # the kill of a paused sandbox asks it nothing
    assert mirror.archive.sandbox("key1", "sbx1").ended_at is None  # until the runtime did kill it
    mirror.halted(record(SandboxState.KILLED))
    assert mirror.archive.sandbox("key1", "sbx1").ended_at is not None
    [session] = mirror.archive.sessions("key1", "sbx1")
    assert (session.ended, session.turn_active, session.pending_permissions, session.event_count) == (
        True,
        False,
        [],
        3,
    )


async def test_a_dead_or_lying_agent_server_never_stops_a_transition(
    tmp_path: Path, agent_server: ScriptedAgentServer, caplog: pytest.LogCaptureFixture
) -> None:
    dead = mirror_of(tmp_path / "dead", agent_server, refuse=True)
    dead.opened("sbx1", AGENT_PORT)
    await dead.halting(record(), record(SandboxState.PAUSED))
    assert "its coding-agent sessions were not copied" in caplog.text

    lying = mirror_of(tmp_path / "lying", agent_server)
    lying.opened("sbx1", AGENT_PORT)
    agent_server.add(2)
    agent_server.lie = True
    agent_server.add(3, "s2")
    await lying.halting(record(), record(SandboxState.KILLED))
    assert lying.archive.length("sbx1", "s1") == 0  # out of order: nothing taken
    assert kept(lying, "s2") == [1, 2, 3]  # and the next session copied all the same
    assert "session s1 not copied" in caplog.text


async def test_a_halt_waits_for_the_deadline_at_most_even_behind_a_pull_that_never_ends(
    tmp_path: Path, agent_server: ScriptedAgentServer, caplog: pytest.LogCaptureFixture
) -> None:
    mirror = mirror_of(tmp_path, agent_server, deadline=0.5)
    mirror.opened("sbx1", AGENT_PORT)
    agent_server.hang = True
    periodic = asyncio.create_task(mirror.pull(record()))  # on a hung agent server: ends at its deadline
    await until(lambda: bool(agent_server.requests))
    with pytest.raises(TimeoutError):
        await periodic
    # A pull that holds the sandbox's lock for ever (the mirror's own lock, taken as a pull takes it): the deadline
    # must cover the wait for it, or the halt (and the pause or kill behind it) would wait for ever too.
    await mirror._locks["sbx1"].acquire()
    await asyncio.wait_for(mirror.halting(record(), record(SandboxState.PAUSED)), timeout=60)
    assert "its coding-agent sessions were not copied" in caplog.text


async def test_the_kill_of_a_sandbox_nobody_followed_copies_the_sessions_started_inside_it(
    tmp_path: Path, agent_server: ScriptedAgentServer
) -> None:
    mirror = mirror_of(tmp_path, agent_server)
    await mirror.halting(record(), record(SandboxState.KILLED))  # no session: one listing asked, nothing kept
    assert agent_server.requests == ["/v1/sessions"]
    assert mirror.archive.sandbox_ids() == []
    agent_server.add(3)  # started inside it since the last sweep: the kill is the last chance to find them
    await mirror.halting(record(), record(SandboxState.KILLED))
    assert kept(mirror) == [1, 2, 3]
    agent_server.hang = True  # an agent server that never answers holds the kill back a second at most
    await asyncio.wait_for(mirror.halting(record(), record(SandboxState.KILLED)), timeout=30)
    asked = len(agent_server.requests)
    empty = mirror_of(tmp_path / "empty", agent_server, may_hold_sessions=False)  # no session in its files
    await empty.halting(record(), record(SandboxState.KILLED))
    assert len(agent_server.requests) == asked  # not asked


class Source:
    def __init__(self, *records: SandboxRecord) -> None:
        self.live = {one.id: one for one in records}

    def leaving(self, sandbox_id: str) -> bool:
        return False


async def test_a_sweep_follows_a_sandbox_whose_sessions_started_inside_it(
    tmp_path: Path, agent_server: ScriptedAgentServer
) -> None:
    mirror = mirror_of(tmp_path, agent_server)
    agent_server.add(2)
    running = asyncio.create_task(mirror.run(Source(record())))  # nobody opened its agent port
    try:
        await until(lambda: mirror.archive.length("sbx1", "s1") == 2)
        agent_server.add(1)  # followed from now on: copied at the next pull, not the next sweep
        await until(lambda: mirror.archive.length("sbx1", "s1") == 3)
    finally:
        running.cancel()
    assert kept(mirror) == [1, 2, 3]
