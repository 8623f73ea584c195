"""The client of a sandbox's coding-agent server (`executor.agent_api`, port 2468), shared by the MCP tools, the
web UI's Sessions tab and the control plane's copy of the sessions (`activator._agent_mirror`).

Every call is one HTTP exchange on a socket of its own: for a caller (`AgentPort.of`) from `open_port`, which wakes
a paused sandbox and counts as its activity; for the mirror straight from the runtime, which does neither. It
carries the sandbox's envd access token as the Bearer token that server checks. A problem document it answers with
becomes `AgentRefused` with its `detail`, its kind and its HTTP status (plus a hint of the caller's, by kind);
anything else that goes wrong is `ExecutorFailed`.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import TypeVar
from urllib.parse import quote

import msgspec

from activator._errors import PortNotOpen
from activator._mcp._errors import AgentRefused, ExecutorFailed, ToolError, executor_failures
from activator._mcp._sandbox import PortActivator, open_port
from executor.agent_api import AGENT_PORT, Problem
from pool import envd

__all__ = ["CALL_DEADLINE", "CREATE_DEADLINE", "AgentPort", "PortActivator", "session_path"]

CALL_DEADLINE = 60.0  # seconds any call may take once connected
CREATE_DEADLINE = 180.0  # creating a session starts the agent (a real one is a Node.js program) on a loaded machine
_MAX_BODY = 64 << 20  # a page of 1000 events with large tool outputs
_T = TypeVar("_T")


class AgentPort:
    """The coding-agent server of one sandbox; `hints`: what to do next, by problem kind, added to the message of
    an `AgentRefused`."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[socket.socket]],
        token: str | None,
        *,
        on_data: Callable[[], None] | None = None,
        hints: Mapping[str, str] | None = None,
    ) -> None:
        """`connect()` opens a socket to the server (port `AGENT_PORT`); `token` is the sandbox's access token;
        `on_data()` is called as a followed stream brings data."""
        self._open = connect
        self._token = token
        self._on_data = on_data
        self._hints: Mapping[str, str] = hints or {}

    @classmethod
    def of(
        cls, activator: PortActivator, owner: str, sandbox_id: str, *, hints: Mapping[str, str] | None = None
    ) -> AgentPort:
        """The server of `owner`'s sandbox as a caller reaches it: woken when paused, its use counted as activity
        (SandboxNotFound before anything else)."""
        token = activator.get(owner, sandbox_id).access_token
        return cls(
            lambda: open_port(activator, owner, sandbox_id, AGENT_PORT), token,
            on_data=lambda: activator.touch(sandbox_id), hints=hints,
        )  # fmt: skip

    async def call(
        self, method: str, path: str, body: msgspec.Struct | None = None, *, deadline: float = CALL_DEADLINE
    ) -> bytes:
        """One exchange; the body of a 2xx answer, AgentRefused for a problem, ExecutorFailed for anything else."""
        what = f"{method} {path.split('?', 1)[0]}"
        headers = self._headers("application/json")
        payload = b""
        if body is not None:
            payload = msgspec.json.encode(body)
            headers["Content-Type"] = "application/json"
        sock = await self._connect()
        try:
            with executor_failures():
                async with (
                    asyncio.timeout(deadline),
                    envd.exchange(sock, method, path, headers, payload) as response,
                ):
                    data = await response.read(_MAX_BODY)
        except TimeoutError as exc:
            raise ExecutorFailed(f"the coding-agent server did not answer {what} within {deadline:g} s") from exc
        if response.status >= 300:
            raise self._refused(response.status, data, what)
        return data

    async def decoded(self, kind: type[_T], method: str, path: str) -> _T:
        data = await self.call(method, path)
        try:
            return msgspec.json.decode(data, type=kind)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ExecutorFailed(
                f"the coding-agent server answered {method} {path} with something else: {exc}"
            ) from exc

    async def follow(self, path: str) -> AsyncGenerator[bytes, None]:
        """The `data` of each frame of the SSE stream at `path`, as they come (heartbeats count as activity)."""
        sock = await self._connect()
        with executor_failures():
            async with envd.exchange(sock, "GET", path, self._headers("text/event-stream")) as response:
                if response.status >= 300:
                    raise self._refused(response.status, await response.read(1 << 20), f"GET {path.split('?', 1)[0]}")
                buffer = b""
                async for chunk in response.chunks():
                    if self._on_data is not None:
                        self._on_data()  # the agent works: the idle policy must not pause it
                    buffer += chunk
                    while (end := buffer.find(b"\n\n")) >= 0:
                        frame, buffer = buffer[:end], buffer[end + 2 :]
                        data = [line[5:].strip() for line in frame.split(b"\n") if line.startswith(b"data:")]
                        if data:
                            yield b"\n".join(data)

    def _headers(self, accept: str) -> dict[str, str]:
        headers = {"Host": f"localhost:{AGENT_PORT}", "Accept": accept}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def _connect(self) -> socket.socket:
        try:
            return await self._open()
        except PortNotOpen as exc:
            raise ToolError(
                f"the sandbox's coding-agent server does not answer on port {AGENT_PORT} (its executor may predate "
                "it, or be restarting); retry, or create a new sandbox"
            ) from exc

    def _refused(self, status: int, body: bytes, what: str) -> ToolError:
        """The agent server's answer as an error: its problem's detail, and what to do about it."""
        try:
            problem = msgspec.json.decode(body, type=Problem)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return ExecutorFailed(f"the coding-agent server answered {what} with HTTP {status}: {body[:300]!r}")
        kind = problem.type.rsplit(":", 1)[-1]
        hint = self._hints.get(kind)
        return AgentRefused(f"{problem.detail}" + (f". {hint}" if hint else ""), kind, status=status)


def session_path(session_id: str) -> str:
    """`/v1/sessions/<id>`, the id quoted."""
    return f"/v1/sessions/{quote(session_id, safe='')}"
