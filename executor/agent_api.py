"""The coding-agent API's wire, defined once for the executor that serves it and every client of it.

Two generations of sandbox-agent's HTTP API share the port (coding-agents.md §2 to §4):

* what the `sandbox-agent@0.4.2` SDK and CLI call: `/v1/health`, `/v1/agents`, ACP over HTTP at
  `/v1/acp/{server_id}` (JSON-RPC envelopes POSTed, answered on the POST and on an SSE stream),
  `/v1/fs/*`, `/v1/config/*`, `/v1/processes/*`, `/v1/desktop/*`; bodies are camelCase;
* the universal session API (`/v1/sessions/*`), whose events are one schema for every agent: the
  envelope and its `data` are snake_case, as in sandbox-agent v0.1.

Errors are RFC 7807 problem documents of type `urn:sandbox-agent:error:<kind>`. Like `envd`, this
module imports msgspec and the standard library only, nothing newer than Python 3.11.2.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = (
    "ACP_TIMEOUT_SECONDS",
    "AGENT_PORT",
    "AGENT_STATE_DIR",
    "ERROR_TITLES",
    "EVENT_TYPES",
    "PROBLEM_JSON",
    "SESSION_ID_PATTERN",
    "AcpServerInfo",
    "AcpServerList",
    "AgentCapabilities",
    "AgentInfo",
    "AgentList",
    "ConfigOption",
    "ConfigOptionValue",
    "CreateSessionRequest",
    "CreateSessionResponse",
    "EventPage",
    "InstallArtifact",
    "InstallRequest",
    "InstallResponse",
    "MessageRequest",
    "PermissionReply",
    "Problem",
    "QuestionReply",
    "SessionInfo",
    "SessionList",
    "UniversalEvent",
    "problem",
)

AGENT_PORT = 2468
"""The agent server's port inside a sandbox (sandbox-agent's default), reached at `2468-<id>.<domain>`."""
AGENT_STATE_DIR = "/var/lib/agent-sandbox/agents"
"""Where a sandbox's agent server keeps its sessions (`sessions/<id>/`) unless told otherwise."""
PROBLEM_JSON = "application/problem+json"
SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
"""A universal session's id: also a directory name, on the sandbox's disk and in the control plane's copy."""
ACP_TIMEOUT_SECONDS = 120.0
"""How long a POSTed ACP request waits for the agent's response before a 504 (as upstream)."""

ERROR_TITLES = {
    "invalid_request": "Invalid Request",
    "conflict": "Conflict",
    "unsupported_agent": "Unsupported Agent",
    "agent_not_installed": "Agent Not Installed",
    "install_failed": "Install Failed",
    "agent_process_exited": "Agent Process Exited",
    "token_invalid": "Token Invalid",
    "permission_denied": "Permission Denied",
    "not_acceptable": "Not Acceptable",
    "unsupported_media_type": "Unsupported Media Type",
    "not_found": "Not Found",
    "session_not_found": "Session Not Found",
    "session_already_exists": "Session Already Exists",
    "mode_not_supported": "Mode Not Supported",
    "stream_error": "Stream Error",
    "timeout": "Timeout",
    "payload_too_large": "Payload Too Large",
    "not_implemented": "Not Implemented",
    "desktop_runtime_inactive": "Desktop Runtime Inactive",
    "internal_error": "Internal Error",
}
"""sandbox-agent's error kinds (its `ErrorType`, plus the three our limits, refusals and own failures need)."""


class Problem(msgspec.Struct, omit_defaults=True):
    """An RFC 7807 error document."""

    type: str
    title: str
    status: int
    detail: str
    details: dict[str, Any] | None = None
    sessionId: str | None = None  # noqa: N815 - the wire's name
    agent: str | None = None


def problem(kind: str, status: int, detail: str, **extra: Any) -> Problem:
    """The problem document of one error kind (a key of `ERROR_TITLES`)."""
    return Problem(f"urn:sandbox-agent:error:{kind}", ERROR_TITLES[kind], status, detail, **extra)


class _Camel(msgspec.Struct, rename="camel", omit_defaults=True):
    """A body of the 0.4.2 API: camelCase on the wire, defaults left out."""


class AgentCapabilities(msgspec.Struct, rename="camel"):
    """What an agent can do, as `AgentInfo.capabilities` reports it (all 18 flags always present)."""

    plan_mode: bool = False
    permissions: bool = False
    questions: bool = False
    tool_calls: bool = False
    tool_results: bool = False
    text_messages: bool = False
    images: bool = False
    file_attachments: bool = False
    session_lifecycle: bool = False
    error_events: bool = False
    reasoning: bool = False
    status: bool = False
    command_execution: bool = False
    file_changes: bool = False
    mcp_tools: bool = False
    streaming_deltas: bool = False
    item_started: bool = False
    shared_process: bool = False


class ConfigOptionValue(_Camel):
    value: str
    name: str
    description: str | None = None


class ConfigOption(_Camel):
    """An ACP `SessionConfigOption` of type select: an agent's model, mode or thought level."""

    id: str
    name: str
    category: Literal["model", "mode", "thought_level"]
    current_value: str
    options: list[ConfigOptionValue]
    type: str = "select"


class AgentInfo(_Camel):
    """One entry of `GET /v1/agents`; `reason` says why an agent that is not installed cannot be."""

    id: str
    installed: bool
    credentials_available: bool
    capabilities: AgentCapabilities
    version: str | None = None
    path: str | None = None
    server_status: dict[str, Any] | None = None
    config_options: list[ConfigOption] | None = None
    reason: str | None = None


class AgentList(_Camel):
    agents: list[AgentInfo]


class InstallRequest(_Camel, forbid_unknown_fields=True):
    reinstall: bool = False
    agent_version: str | None = None
    agent_process_version: str | None = None


class InstallArtifact(_Camel):
    kind: str
    path: str
    source: str
    version: str | None = None


class InstallResponse(msgspec.Struct):
    already_installed: bool
    artifacts: list[InstallArtifact]


class AcpServerInfo(_Camel):
    server_id: str
    agent: str
    created_at_ms: int


class AcpServerList(_Camel):
    servers: list[AcpServerInfo]


# The universal session API.

EVENT_TYPES = frozenset(
    {
        "session.started",
        "session.ended",
        "turn.started",
        "turn.ended",
        "item.started",
        "item.delta",
        "item.completed",
        "error",
        "permission.requested",
        "permission.resolved",
        "question.requested",
        "question.resolved",
        "agent.unparsed",
    }
)


class CreateSessionRequest(_Camel, forbid_unknown_fields=True):
    """`POST /v1/sessions/{id}`; `env` reaches the agent's process only, never the event log.

    `permission_timeout_ms` bounds how long a permission request waits for a reply; past it, or when
    the turn is cancelled or the agent dies, it is resolved with `permission_default`.
    """

    agent: str
    agent_mode: str | None = None
    permission_mode: str | None = None
    model: str | None = None
    variant: str | None = None
    agent_version: str | None = None
    directory: str | None = None
    title: str | None = None
    env: dict[str, str] = {}
    permission_timeout_ms: int = 300_000
    permission_default: Literal["reject", "once"] = "reject"


class CreateSessionResponse(_Camel):
    healthy: bool
    native_session_id: str | None = None
    error: Problem | None = None


class MessageRequest(_Camel, forbid_unknown_fields=True):
    message: str


class PermissionReply(_Camel, forbid_unknown_fields=True):
    reply: Literal["once", "always", "reject"]


class QuestionReply(_Camel, forbid_unknown_fields=True):
    answers: list[list[str]]


class SessionInfo(_Camel):
    """One session as `GET /v1/sessions` lists it (newest first)."""

    session_id: str
    agent: str
    created_at: str
    ended: bool
    event_count: int
    agent_mode: str | None = None
    permission_mode: str | None = None
    model: str | None = None
    title: str | None = None
    directory: str | None = None
    native_session_id: str | None = None
    turn_active: bool = False
    pending_permissions: list[str] = []
    """The ids of the permission requests waiting for a reply."""


class SessionList(_Camel):
    sessions: list[SessionInfo]


class UniversalEvent(msgspec.Struct):
    """One event of a session's log: `sequence` counts from 1 per session and never changes."""

    event_id: str
    sequence: int
    time: str
    session_id: str
    native_session_id: str | None
    source: Literal["agent", "daemon"]
    synthetic: bool
    type: str
    data: dict[str, Any]
    raw: Any = None


class EventPage(_Camel):
    """`GET /v1/sessions/{id}/events`: the events with `sequence > offset`, at most `limit` of them."""

    events: list[UniversalEvent]
    has_more: bool
