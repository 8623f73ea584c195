"""The ACP-over-HTTP routes, as the `sandbox-agent@0.4.2` SDK's transport and the CLI's `api acp` call them.

    GET    /v1/acp                  {servers: [{serverId, agent, createdAtMs}]}
    POST   /v1/acp/{server_id}      one JSON-RPC envelope (`?agent=` on the first): a request → 200 with the
                                    agent's response (504 after ACP_TIMEOUT_SECONDS); anything else → 202
    GET    /v1/acp/{server_id}      SSE of everything the agent wrote, from `Last-Event-ID`; 404 before the first POST
    DELETE /v1/acp/{server_id}      204 once the agent and its process group are gone (unknown ids too)

Status codes and problem documents follow upstream (coding-agents.md §2.2, §3.2), except that DELETE
returns (upstream's never does) and replay reaches back to the first event (upstream keeps 1024).
"""

from __future__ import annotations

from executor._agents._acp_hub import SERVER_ID, AcpHub, AgentMismatch, TooManyServers
from executor._agents._acp_server import AcpServer, AgentExited, PendingConflict
from executor._agents._http import JSON, ApiError, accepts, count, follow, read_json, send_json
from executor._agents._launch import NotInstalled, UnknownAgent
from executor._errors import ExecutorError
from executor._exchange import Request, Response
from executor.agent_api import ACP_TIMEOUT_SECONDS, AcpServerInfo, AcpServerList

__all__ = ("OPENING_ERRORS", "AcpRoutes", "open_server", "opening_error")


OPENING_ERRORS = (AgentMismatch, UnknownAgent, NotInstalled, TooManyServers, ExecutorError)
"""What `AcpHub.open` raises when it cannot give the server asked for."""


def open_server(hub: AcpHub, server_id: str, agent: str) -> AcpServer:
    """`hub.open` with its refusals as problem documents."""
    if not SERVER_ID.fullmatch(server_id):
        raise ApiError("invalid_request", 400, f"invalid server id '{server_id}': use 1-128 of [A-Za-z0-9._:-]")
    try:
        return hub.open(server_id, agent)
    except OPENING_ERRORS as exc:
        raise opening_error(exc, agent) from exc


def opening_error(exc: Exception, agent: str) -> ApiError:
    """The problem document of one of `OPENING_ERRORS`."""
    if isinstance(exc, AgentMismatch):
        return ApiError("conflict", 409, f"conflict: {exc}", details={"message": str(exc)})
    if isinstance(exc, UnknownAgent):
        return ApiError("unsupported_agent", 400, str(exc), agent=agent)
    if isinstance(exc, NotInstalled):
        return ApiError("agent_not_installed", 400, f"agent {agent} is not installed: {exc}", agent=agent)
    if isinstance(exc, TooManyServers):
        return ApiError("conflict", 409, str(exc))
    message = exc.message if isinstance(exc, ExecutorError) else str(exc)  # the process could not be started
    return ApiError("agent_process_exited", 500, f"cannot start the {agent} agent: {message}")


class AcpRoutes:
    def __init__(self, hub: AcpHub) -> None:
        self._hub = hub

    async def list(self, request: Request, response: Response) -> None:
        servers = [AcpServerInfo(s.server_id, s.agent, s.created_at_ms) for s in self._hub.servers()]
        await send_json(response, 200, AcpServerList(servers))

    async def post(self, request: Request, response: Response, server_id: str) -> None:
        if not accepts(request, JSON):
            raise ApiError(
                "not_acceptable", 406, "not acceptable: accept must allow application/json",
                details={"message": "accept must allow application/json"},
            )  # fmt: skip
        message = await read_json(request)
        server = self._hub.get(server_id)
        agent = request.query.get("agent")
        if server is None:
            if not agent:
                raise ApiError(
                    "invalid_request", 400,
                    f"invalid request: missing required 'agent' query parameter for first POST to /v1/acp/{server_id}",
                )  # fmt: skip
            server = open_server(self._hub, server_id, agent)
        elif agent and agent != server.agent:
            open_server(self._hub, server_id, agent)  # raises the conflict
        if not isinstance(message, dict) or not ("method" in message or "id" in message):
            await response.send(202)  # not JSON-RPC: nothing to deliver (as upstream)
            return
        try:
            if "method" in message and "id" in message:
                answer = await server.request(message, ACP_TIMEOUT_SECONDS)
                await response.send(200, answer, JSON)
                return
            await server.notify(message)
        except PendingConflict as exc:
            raise ApiError("conflict", 409, str(exc)) from exc
        except TimeoutError as exc:
            raise ApiError(
                "timeout", 504, f"the agent did not answer {message['method']} within {ACP_TIMEOUT_SECONDS:.0f} s"
            ) from exc
        except (AgentExited, ConnectionError) as exc:
            raise ApiError("agent_process_exited", 502, str(exc), agent=server.agent) from exc
        await response.send(202)

    async def stream(self, request: Request, response: Response, server_id: str) -> None:
        if not accepts(request, "text/event-stream"):
            raise ApiError(
                "not_acceptable", 406, "not acceptable: accept must allow text/event-stream",
                details={"message": "accept must allow text/event-stream"},
            )  # fmt: skip
        server = self._hub.get(server_id)
        if server is None:
            raise ApiError("session_not_found", 404, f"session not found: {server_id}", sessionId=server_id)
        last = request.headers.get("last-event-id", "0").strip()
        with server.reading() as log:
            await follow(response, log, count(last) or 0, b"message")

    async def delete(self, request: Request, response: Response, server_id: str) -> None:
        await self._hub.close(server_id)
        await response.send(204)
