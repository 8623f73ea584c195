"""`GET /v1/openapi.json`: the agent port's OpenAPI 3.1 document (upstream serves none).

Paths and methods come from the routing table (`AgentApp.routes`), so a route cannot be served and
left out; what each operation takes and answers comes from `OPERATIONS`, whose bodies are the wire
types themselves (their JSON Schemas made by msgspec). Building the document fails when a route has
no entry there, or an entry no route, so the two cannot drift apart (a test builds it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from executor._agents._fs_routes import FsEntry, FsMoveRequest, FsStat
from executor._agents._process_routes import (
    CreateRequest,
    InputRequest,
    ProcessConfig,
    ProcessInfo,
    ResizeRequest,
    RunRequest,
)
from executor.agent_api import (
    PROBLEM_JSON,
    AcpServerList,
    AgentInfo,
    AgentList,
    CreateSessionRequest,
    CreateSessionResponse,
    EventPage,
    InstallRequest,
    InstallResponse,
    MessageRequest,
    PermissionReply,
    Problem,
    QuestionReply,
    SessionInfo,
    SessionList,
)

__all__ = ("OPERATIONS", "document")

VERSION = "0.4.2"
"""The sandbox-agent release whose API this serves."""

Body = type | str | None
"""A wire type (JSON), a media type (a raw or streamed body), or none."""


@dataclass(frozen=True)
class Operation:
    summary: str
    request: Body = None
    response: Body = None
    status: int = 200
    query: tuple[str, ...] = ()


_JSON_RPC = "application/json"  # an ACP envelope: JSON-RPC 2.0, not described further here
_SSE = "text/event-stream"
_EMPTY: Body = None

OPERATIONS: dict[str, Operation] = {
    "GET /": Operation("What serves this port (no token needed)", response=dict),
    "GET /v1/health": Operation("Health", response=dict),
    "GET /v1/openapi.json": Operation("This document", response=dict),
    "GET /v1/agents": Operation("Every agent and whether it can run here", response=AgentList, query=("config",)),
    "GET /v1/agents/{agent}": Operation("One agent", response=AgentInfo, query=("config",)),
    "POST /v1/agents/{agent}/install": Operation(
        "npm install of the agent's pinned packages", InstallRequest, InstallResponse
    ),
    "GET /v1/acp": Operation("The open ACP servers", response=AcpServerList),
    "POST /v1/acp/{server_id}": Operation(
        "Send a JSON-RPC envelope (opens the server with ?agent)", _JSON_RPC, _JSON_RPC, query=("agent",)
    ),
    "GET /v1/acp/{server_id}": Operation("Everything the agent said, over SSE (Last-Event-ID replays)", response=_SSE),
    "DELETE /v1/acp/{server_id}": Operation("Close the server and end the agent's process group", status=204),
    "GET /v1/fs/entries": Operation("List a directory", response=list[FsEntry], query=("path",)),
    "GET /v1/fs/file": Operation("Read a file", response="application/octet-stream", query=("path",)),
    "PUT /v1/fs/file": Operation("Write a file (parents created)", "application/octet-stream", dict, query=("path",)),
    "DELETE /v1/fs/entry": Operation("Remove a file or directory", response=dict, query=("path", "recursive")),
    "POST /v1/fs/mkdir": Operation("Make a directory and its parents", response=dict, query=("path",)),
    "POST /v1/fs/move": Operation("Move or rename", FsMoveRequest, dict),
    "GET /v1/fs/stat": Operation("Stat a path", response=FsStat, query=("path",)),
    "POST /v1/fs/upload-batch": Operation(
        "Unpack a tar of files and directories", "application/x-tar", dict, query=("path",)
    ),
    "GET /v1/config/mcp": Operation("One MCP server entry", response=dict, query=("directory", "mcpName")),
    "PUT /v1/config/mcp": Operation("Store an MCP server entry", dict, status=204, query=("directory", "mcpName")),
    "DELETE /v1/config/mcp": Operation("Remove an MCP server entry", status=204, query=("directory", "mcpName")),
    "GET /v1/config/skills": Operation("One skills entry", response=dict, query=("directory", "skillName")),
    "PUT /v1/config/skills": Operation("Store a skills entry", dict, status=204, query=("directory", "skillName")),
    "DELETE /v1/config/skills": Operation("Remove a skills entry", status=204, query=("directory", "skillName")),
    "GET /v1/processes/config": Operation("The process limits", response=ProcessConfig),
    "POST /v1/processes/config": Operation("Change the process limits", ProcessConfig, ProcessConfig),
    "POST /v1/processes/run": Operation("Run a command to its end", RunRequest, dict),
    "GET /v1/processes": Operation("The processes started here", response=dict, query=("owner",)),
    "POST /v1/processes": Operation("Start a process", CreateRequest, ProcessInfo),
    "GET /v1/processes/{process_id}": Operation("One process", response=ProcessInfo),
    "DELETE /v1/processes/{process_id}": Operation("Forget a process (killed first if running)", status=204),
    "POST /v1/processes/{process_id}/stop": Operation("SIGTERM", response=ProcessInfo, query=("waitMs",)),
    "POST /v1/processes/{process_id}/kill": Operation("SIGKILL", response=ProcessInfo, query=("waitMs",)),
    "GET /v1/processes/{process_id}/logs": Operation(
        "Output entries, or with follow=true and Accept: text/event-stream the live stream",
        response=dict,
        query=("stream", "since", "tail", "follow"),
    ),
    "POST /v1/processes/{process_id}/input": Operation("Write to the process's stdin or PTY", InputRequest, dict),
    "POST /v1/processes/{process_id}/terminal/resize": Operation("Resize the PTY", ResizeRequest, dict),
    "GET /v1/processes/{process_id}/terminal/ws": Operation(
        "The terminal over a WebSocket (token in ?access_token=)", status=101, query=("access_token",)
    ),
    "GET /v1/desktop/status": Operation("Whether this sandbox has a desktop", response=dict),
    "GET /v1/sessions": Operation("Every session, newest first", response=SessionList),
    "POST /v1/sessions/{session_id}": Operation(
        "Create a session and start its agent", CreateSessionRequest, CreateSessionResponse
    ),
    "GET /v1/sessions/{session_id}": Operation("One session", response=SessionInfo),
    "POST /v1/sessions/{session_id}/messages": Operation(
        "Start a turn (409 while one runs)", MessageRequest, status=204
    ),
    "POST /v1/sessions/{session_id}/messages/stream": Operation(
        "Start a turn and stream its events", MessageRequest, _SSE
    ),
    "GET /v1/sessions/{session_id}/events": Operation(
        "Events after offset", response=EventPage, query=("offset", "limit")
    ),
    "GET /v1/sessions/{session_id}/events/sse": Operation(
        "Events after offset, then live, over SSE", response=_SSE, query=("offset",)
    ),
    "POST /v1/sessions/{session_id}/permissions/{permission_id}/reply": Operation(
        "Answer a permission request", PermissionReply, status=204
    ),
    "POST /v1/sessions/{session_id}/questions/{question_id}/reply": Operation(
        "Answer a question (none are asked: 400)", QuestionReply, status=204
    ),
    "POST /v1/sessions/{session_id}/questions/{question_id}/reject": Operation(
        "Reject a question (none are asked: 400)", status=204
    ),
    "POST /v1/sessions/{session_id}/cancel": Operation("Cancel the running turn", status=204),
    "POST /v1/sessions/{session_id}/terminate": Operation("End the session (idempotent)", status=204),
}

_PARAMETER = re.compile(r"\{(\w+)\}")


def document(routes: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """The OpenAPI document of these (path, methods) routes; ValueError when they and `OPERATIONS` differ."""
    served = {f"{method} {path}" for path, methods in routes for method in methods}
    if served != set(OPERATIONS):
        raise ValueError(f"routes without an operation: {served - set(OPERATIONS)}; stale: {set(OPERATIONS) - served}")
    types = sorted(
        {body for op in OPERATIONS.values() for body in (op.request, op.response) if _is_type(body)} | {Problem},
        key=repr,
    )
    refs, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    schema = dict(zip(types, refs, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for key, operation in OPERATIONS.items():
        method, path = key.split(" ", 1)
        paths.setdefault(path, {})[method.lower()] = _operation(key, path, operation, schema)
    return {
        "openapi": "3.1.0",
        "info": {"title": "agent-sandbox agent server", "version": VERSION},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": paths,
    }


def _is_type(body: Body) -> bool:
    return body is not None and not isinstance(body, str)


def _content(body: Body, schema: dict[Any, Any]) -> dict[str, Any]:
    if isinstance(body, str):
        return {body: {}}
    return {"application/json": {"schema": schema[body]}}


def _operation(key: str, path: str, operation: Operation, schema: dict[Any, Any]) -> dict[str, Any]:
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PARAMETER.findall(path)
    ] + [{"name": name, "in": "query", "schema": {"type": "string"}} for name in operation.query]
    answer: dict[str, Any] = {"description": operation.summary}
    if operation.response is not None:
        answer["content"] = _content(operation.response, schema)
    problem = {"description": "an error", "content": {PROBLEM_JSON: {"schema": schema[Problem]}}}
    described: dict[str, Any] = {
        "operationId": re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_").lower(),
        "summary": operation.summary,
        "parameters": parameters,
        "responses": {str(operation.status): answer, "default": problem},
    }
    if operation.request is not None:
        described["requestBody"] = {"required": True, "content": _content(operation.request, schema)}
    if key == "GET /":
        described["security"] = []
    return described
