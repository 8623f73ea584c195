"""ACP over HTTP: one agent process per `server_id`, its messages numbered in a log for the SSE stream.

What the `sandbox-agent@0.4.2` transport relies on (coding-agents.md §3): a POSTed request waits for
the agent's response (`ACP_TIMEOUT_SECONDS`, then 504) and gets it as the POST's body; notifications
and responses to the agent's own requests are sent on and answered 202. Everything the agent writes
(its requests, notifications and responses) is appended to the server's log, which the SSE stream
replays from `Last-Event-ID` and then follows. When the agent exits, `_adapter/agent_exited` (with its
exit code and the tail of its stderr) is the last event, and requests still waiting fail at once.
The log's file goes when the hub forgets the server (`discard`), but not before the last SSE stream
reading it (`reading`) has ended: a stream that lags behind still gets every event and the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from executor._processes import Exit
from executor.event_log import EventLog

__all__ = ("AcpServer", "AgentExited", "PendingConflict", "jsonrpc_id_key")

logger = logging.getLogger("executor")


class AgentExited(Exception):
    """The agent process ended before it answered."""


class PendingConflict(Exception):
    """A request with this id is already waiting for its response."""


def jsonrpc_id_key(value: Any) -> str:
    """A JSON-RPC id as a dict key: 1 and "1" stay different, as the protocol says."""
    return json.dumps(value)


class AcpServer:
    """One `server_id`: the agent's process (started by `start`), its log and the requests waiting on it."""

    def __init__(self, server_id: str, agent: str, log: EventLog) -> None:
        self.server_id = server_id
        self.agent = agent
        self.created_at_ms = int(time.time() * 1000)
        self.log = log
        self._pending: dict[str, asyncio.Future[bytes]] = {}
        self._send: Callable[[bytes], Any] | None = None
        self._redact: Callable[[str], str] = str
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        self._readers = 0
        self._discarded = False

    def attach(self, send: Callable[[bytes], Any], redact: Callable[[str], str]) -> None:
        """Connect the agent's stdin (`send`) and how its stderr is cleaned of secrets before it is logged."""
        self._send = send
        self._redact = redact

    @property
    def exited(self) -> bool:
        return self.log.closed

    @contextlib.contextmanager
    def reading(self) -> Iterator[EventLog]:
        """The log, for a stream that reads it; its file stays until the last such stream has ended."""
        self._readers += 1
        try:
            yield self.log
        finally:
            self._readers -= 1
            self._remove_unread()

    def discard(self) -> None:
        """The server is gone: close its log and remove the file now, or once the last stream is done with it."""
        if not self.log.closed:
            self.log.close()
        self._discarded = True
        self._remove_unread()

    def _remove_unread(self) -> None:
        if self._discarded and self._readers == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log.path)

    async def request(self, message: dict[str, Any], timeout: float) -> bytes:  # noqa: ASYNC109 - the wait is ours
        """Send a client request and return the agent's response (raw JSON)."""
        key = jsonrpc_id_key(message["id"])
        if key in self._pending:
            raise PendingConflict(f"a request with id {message['id']!r} is already waiting for its response")
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            await self.notify(message)
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            self._pending.pop(key, None)

    async def notify(self, message: dict[str, Any]) -> None:
        """Send a notification, or a response to one of the agent's requests."""
        if self._send is None or self.exited:
            raise AgentExited(f"the {self.agent} agent process has exited")
        await self._send(json.dumps(message, separators=(",", ":")).encode())

    def received(self, line: bytes) -> None:
        """One line from the agent: logged; a response resolves its request; listeners see it decoded."""
        if self.log.closed:
            return  # the server was closed; the agent is on its way out
        try:
            message = json.loads(line)
        except ValueError:
            return  # not JSON-RPC (a stray print); it is in neither the log nor the stream
        self.log.append(line)
        if isinstance(message, dict):
            if "method" not in message and "id" in message:
                future = self._pending.get(jsonrpc_id_key(message["id"]))
                if future is not None and not future.done():
                    future.set_result(line)
            self._tell(message)

    def _tell(self, message: dict[str, Any]) -> None:
        for listener in self.listeners:
            try:
                listener(message)
            except Exception:  # one listener's bug (an odd message) must not keep the others or the reader from it
                logger.exception("a listener of %s failed on %s", self.server_id, message.get("method", "a response"))

    def ended(self, end: Exit, stderr_tail: str) -> None:
        """The agent exited: the last event says how; whoever waits is told."""
        for future in self._pending.values():
            if not future.done():
                future.set_exception(AgentExited(f"the {self.agent} agent process exited ({end.status})"))
        if self.log.closed:
            return
        params = {"code": end.exit_code, "success": end.exit_code == 0 and end.exited, "status": end.status}
        if stderr_tail:
            params["stderr"] = self._redact(stderr_tail)
        notice = {"jsonrpc": "2.0", "method": "_adapter/agent_exited", "params": params}
        self.log.append(json.dumps(notice, separators=(",", ":")).encode())
        self._tell(notice)
        self.log.close()
