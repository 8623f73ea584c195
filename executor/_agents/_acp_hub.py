"""The running ACP servers by `server_id`: opening one starts its agent, closing one ends it.

Both the ACP routes and the universal sessions open servers here (a session's server id is
`session-<session id>`), so one table knows every agent process. A server's log lives in
`<state>/acp/<server_id>.<n>.jsonl` (n counts the servers opened, so a server reopened under the same
id starts a log of its own) and goes with it: the ACP generation keeps no history past a close, and
nothing of it survives the executor (the universal sessions keep their own, durable, logs).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil

from executor._agents._acp_server import AcpServer
from executor._agents._agent_process import AgentProcess
from executor._agents._launch import Launcher
from executor._processes import ProcessTable
from executor.event_log import EventLog

__all__ = ("SERVER_ID", "AcpHub", "AgentMismatch", "TooManyServers")

SERVER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
MAX_SERVERS = 64


class AgentMismatch(Exception):
    """The server exists for another agent."""


class TooManyServers(Exception):
    """`MAX_SERVERS` agents already run."""


class AcpHub:
    """Every ACP server of this executor."""

    def __init__(self, table: ProcessTable, launcher: Launcher) -> None:
        self._table = table
        self.launcher = launcher
        self._servers: dict[str, AcpServer] = {}
        self._processes: dict[str, AgentProcess] = {}
        self._opened = 0
        self._directory = os.path.join(launcher.state_dir, "acp")
        shutil.rmtree(self._directory, ignore_errors=True)  # servers of an earlier executor have no process
        os.makedirs(self._directory, mode=0o700)

    def get(self, server_id: str) -> AcpServer | None:
        return self._servers.get(server_id)

    def servers(self) -> list[AcpServer]:
        return list(self._servers.values())

    def open(
        self, server_id: str, agent: str, env: dict[str, str] | None = None, directory: str | None = None
    ) -> AcpServer:
        """The server `server_id`, started for `agent` if it does not exist; AgentMismatch for another agent."""
        existing = self._servers.get(server_id)
        if existing is not None:
            if existing.agent != agent:
                raise AgentMismatch(
                    f"server '{server_id}' already exists for agent '{existing.agent}'; requested '{agent}'"
                )
            return existing
        if sum(not running.exited for running in self._servers.values()) >= MAX_SERVERS:  # the dead stay for DELETE
            raise TooManyServers(f"at most {MAX_SERVERS} agent servers run at once; close one first")
        extra = env or {}
        spec = self.launcher.spec(agent, extra, directory, tag=f"agent:{server_id}")
        self._opened += 1
        log = EventLog(os.path.join(self._directory, f"{server_id}.{self._opened}.jsonl"))
        server = AcpServer(server_id, agent, log)
        process = AgentProcess(self._table, spec, server.received, lambda end: server.ended(end, process.stderr_tail))
        server.attach(process.send, self.launcher.redactor(extra))
        self._servers[server_id] = server
        self._processes[server_id] = process
        return server

    async def close(self, server_id: str) -> bool:
        """End the server's agent and forget it; whether it existed."""
        server = self._servers.pop(server_id, None)
        process = self._processes.pop(server_id, None)
        if server is None or process is None:
            return False
        await process.stop()
        server.discard()  # its file stays while a stream still reads it
        return True

    async def close_all(self) -> None:
        await asyncio.gather(*(self.close(server_id) for server_id in list(self._servers)))
