"""E2B control-plane JSON, as msgspec structs (reference: e2b-protocol.md §2.3, infra `spec/openapi.yml`).

Names are camelCase, with E2B's irregular ones spelled out per field (`templateID`, `memoryMB`,
`allow_internet_access`). Request structs accept unknown fields: the SDKs send fields (mcp, volumes, ...) this
server does not use yet, and rejecting them would break those SDKs. The network options are the exception: each
one is either honoured or refused by name, and an unknown one is a 400, because a rule silently dropped is a
sandbox its user is wrong about.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from executor.agent_api import SessionInfo
from executor.envd import EnvVars

__all__ = [
    "AgentSessionsKept",
    "AssignTags",
    "AssignedTags",
    "AutoResume",
    "BuildLogEntryOut",
    "BuildReason",
    "ConnectRequest",
    "ErrorBody",
    "KeptAgentSession",
    "LifecycleIn",
    "LifecycleOut",
    "ListedSandbox",
    "LogEntry",
    "LogLine",
    "LogsV1",
    "LogsV2",
    "NetworkIn",
    "NetworkOut",
    "NetworkUpdate",
    "NewSandbox",
    "NewVolume",
    "PauseRequest",
    "RefreshRequest",
    "RemoveTags",
    "ResumeRequest",
    "Sandbox",
    "SandboxDetail",
    "SandboxMetric",
    "TemplateAlias",
    "TemplateBuildRequest",
    "TemplateBuildRequested",
    "TemplateBuildStatus",
    "TemplateFilesLink",
    "TemplateOut",
    "TemplateTagOut",
    "TimeoutRequest",
    "VolumeAndToken",
    "VolumeMetadata",
    "VolumeMountIn",
    "VolumeOut",
]

_Seconds = Annotated[int, msgspec.Meta(ge=0)]


class _Wire(msgspec.Struct, rename="camel", omit_defaults=True):
    """E2B's conventions; fields without a default are always sent (so `domain: null` stays on the wire).

    `kw_only` is not inherited, so subclasses list their required fields first.
    """


# --- requests ---------------------------------------------------------------------------------------------------


class AutoResume(_Wire):
    enabled: bool = False


class LifecycleIn(_Wire):
    on_timeout: Literal["kill", "pause"] | None = None
    auto_resume: bool | None = None


class NetworkIn(_Wire, forbid_unknown_fields=True):
    """`SandboxNetworkConfig` of a create; `rules`, `egressProxy` and `dnsServers` are refused."""

    allow_out: list[str] | None = None
    deny_out: list[str] | None = None
    allow_public_traffic: bool | None = None
    mask_request_host: str | None = None
    rules: dict[str, Any] | None = None
    egress_proxy: Any = None
    dns_servers: list[str] | None = None
    https_ports: list[int] | None = None


class NetworkUpdate(_Wire, forbid_unknown_fields=True):
    """`SandboxNetworkUpdateConfig` (PUT /sandboxes/{id}/network): the whole egress config; omitted is cleared."""

    allow_out: list[str] | None = None
    deny_out: list[str] | None = None
    rules: dict[str, Any] | None = None
    egress_proxy: Any = None
    dns_servers: list[str] | None = None
    allow_internet_access: bool | None = msgspec.field(default=None, name="allow_internet_access")


class VolumeMountIn(_Wire):
    """`SandboxVolumeMount`: the key's volume `name` at `path` in the sandbox."""

    name: str
    path: str


class NewVolume(_Wire):
    name: Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9_-]+$", min_length=1, max_length=128)]


class VolumeOut(_Wire):
    """`Volume` (GET /volumes)."""

    volume_id: str = msgspec.field(name="volumeID")
    name: str


class VolumeAndToken(VolumeOut, kw_only=True):
    """`VolumeAndToken` (POST /volumes, GET /volumes/{id}); no `domain`: content calls go to the API's host."""

    token: str


class VolumeMetadata(_Wire):
    """The content API's PATCH body: what to change of an entry."""

    uid: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    gid: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    mode: Annotated[int, msgspec.Meta(ge=0, le=0o7777)] | None = None


class NewSandbox(_Wire):
    """`NewSandboxV2` (POST /v2/sandboxes) and `NewSandbox` (POST /sandboxes, which adds `secure`)."""

    template_id: str = msgspec.field(name="templateID")
    timeout: _Seconds | None = None
    auto_pause: bool | None = None
    auto_resume: AutoResume | None = None
    lifecycle: LifecycleIn | None = None  # the JS SDK's form of autoPause / autoResume
    allow_internet_access: bool | None = msgspec.field(default=None, name="allow_internet_access")
    network: NetworkIn | None = None
    iam: Any = None  # workload identity tokens: refused
    volume_mounts: list[VolumeMountIn] | None = msgspec.field(default=None, name="volumeMounts")
    secure: bool | None = None
    metadata: dict[str, str] | None = None
    env_vars: EnvVars | None = None


class ConnectRequest(_Wire):
    """`ConnectSandboxV2` and v1 `ConnectSandbox`; `memory: false` resumes a paused sandbox from its files only."""

    timeout: _Seconds | None = None
    memory: bool = True


class PauseRequest(_Wire):
    """`SandboxPauseRequest`: `memory: false` keeps files only; `requireHealthyGuest` pauses only a sandbox whose
    executor answers."""

    memory: bool = True
    require_healthy_guest: bool = False


class ResumeRequest(_Wire):
    """v1 `ResumedSandbox`; the deprecated `autoPause` is accepted and ignored."""

    timeout: _Seconds | None = None


class TimeoutRequest(_Wire):
    timeout: _Seconds


class RefreshRequest(_Wire):
    duration: Annotated[int, msgspec.Meta(ge=0, le=3600)] | None = None


# --- responses --------------------------------------------------------------------------------------------------


class ErrorBody(_Wire):
    code: int
    message: str
    error_code: str | None = msgspec.field(default=None, name="error_code")  # E2B's machine-readable code


class Sandbox(_Wire):
    """Answer of create, connect and resume. The SDK's parser needs `clientID` and `envdVersion`."""

    template_id: str = msgspec.field(name="templateID")
    sandbox_id: str = msgspec.field(name="sandboxID")
    client_id: str = msgspec.field(name="clientID")
    envd_version: str
    traffic_access_token: str | None
    domain: str | None  # null: clients use their E2B_DOMAIN / E2B_SANDBOX_URL
    alias: str | None = None
    envd_access_token: str | None = None


class ListedSandbox(_Wire):
    template_id: str = msgspec.field(name="templateID")
    sandbox_id: str = msgspec.field(name="sandboxID")
    client_id: str = msgspec.field(name="clientID")
    started_at: datetime
    end_at: datetime
    cpu_count: int
    memory_mb: int = msgspec.field(name="memoryMB")
    disk_size_mb: int = msgspec.field(name="diskSizeMB")
    state: Literal["running", "paused"]
    envd_version: str
    metadata: dict[str, str]
    alias: str | None = None


class LifecycleOut(_Wire):
    auto_resume: bool
    on_timeout: Literal["kill", "pause"]


class NetworkOut(_Wire):
    """The network options in force, as E2B's `SandboxDetail.network` reports them."""

    allow_public_traffic: bool
    allow_out: list[str] | None = None
    deny_out: list[str] | None = None
    mask_request_host: str | None = None
    https_ports: list[int] | None = None


class SandboxDetail(ListedSandbox, kw_only=True):
    domain: str | None
    allow_internet_access: bool | None
    lifecycle: LifecycleOut
    network: NetworkOut
    volume_mounts: list[VolumeMountIn] = msgspec.field(default_factory=list, name="volumeMounts")
    envd_access_token: str | None = None


class SandboxMetric(_Wire):
    timestamp: datetime
    timestamp_unix: int
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


class LogLine(_Wire):
    timestamp: datetime
    line: str


class LogEntry(_Wire):
    timestamp: datetime
    level: Literal["debug", "info", "warn", "error"]
    message: str
    fields: dict[str, str]


class LogsV1(_Wire):
    logs: list[LogLine]
    log_entries: list[LogEntry]


class LogsV2(_Wire):
    logs: list[LogEntry]


class TemplateOut(_Wire):
    """E2B's `Template` (GET /templates, GET /v2/templates)."""

    template_id: str = msgspec.field(name="templateID")
    build_id: str = msgspec.field(name="buildID")
    cpu_count: int
    memory_mb: int = msgspec.field(name="memoryMB")
    disk_size_mb: int = msgspec.field(name="diskSizeMB")
    public: bool
    aliases: list[str]
    names: list[str]
    created_at: datetime
    updated_at: datetime
    created_by: None
    last_spawned_at: datetime | None
    spawn_count: int
    build_count: int
    envd_version: str
    build_status: Literal["waiting", "building", "ready", "error"]
    description: str | None = None


class TemplateAlias(_Wire):
    """Answer of GET /templates/aliases/{alias}: the template an alias names (`Template.exists`)."""

    template_id: str = msgspec.field(name="templateID")
    public: bool


# Template builds (the Template SDK, e2b-features.md §1.2)

_TemplateName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class TemplateBuildRequest(_Wire, kw_only=True):
    """`POST /v3/templates`: a new build of a template named `name[:tag]` (a namespace prefix is ignored)."""

    name: _TemplateName | None = None
    alias: _TemplateName | None = None  # the older SDKs' spelling of `name`
    tags: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]], msgspec.Meta(max_length=64)] = []
    team_id: str | None = msgspec.field(default=None, name="teamID")
    cpu_count: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    memory_mb: Annotated[int, msgspec.Meta(ge=128, le=1 << 20)] = msgspec.field(default=1024, name="memoryMB")
    min_free_disk_mb: Annotated[int, msgspec.Meta(ge=0)] | None = None


class TemplateBuildRequested(_Wire, kw_only=True):
    template_id: str = msgspec.field(name="templateID")
    build_id: str = msgspec.field(name="buildID")
    public: bool
    names: list[str]
    tags: list[str]
    aliases: list[str]


class TemplateFilesLink(_Wire, kw_only=True):
    """`GET /templates/{id}/files/{hash}`: whether the server has a COPY step's files, and where to upload them."""

    present: bool
    url: str | None = None


class BuildLogEntryOut(_Wire, kw_only=True):
    timestamp: datetime
    level: Literal["debug", "info", "warn", "error"]
    message: str
    step: str | None = None


class BuildReason(_Wire, kw_only=True):
    message: str
    step: str | None = None
    log_entries: list[BuildLogEntryOut] = []


class TemplateBuildStatus(_Wire, kw_only=True):
    template_id: str = msgspec.field(name="templateID")
    build_id: str = msgspec.field(name="buildID")
    status: Literal["waiting", "building", "ready", "error"]
    logs: list[str]
    log_entries: list[BuildLogEntryOut]
    reason: BuildReason | None = None


class TemplateTagOut(_Wire, kw_only=True):
    tag: str
    build_id: str = msgspec.field(name="buildID")
    created_at: datetime


class AssignTags(_Wire, kw_only=True):
    target: _TemplateName
    tags: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=64)]], msgspec.Meta(min_length=1)]


class AssignedTags(_Wire, kw_only=True):
    build_id: str = msgspec.field(name="buildID")
    tags: list[str]


class RemoveTags(_Wire, kw_only=True):
    name: _TemplateName
    tags: Annotated[list[str], msgspec.Meta(min_length=1)]


# Snapshots (e2b-features.md §3)


class ForkRequest(_Wire, kw_only=True):
    """`POST /sandboxes/{id}/fork` (`SandboxForkRequest`): the forks' timeout in seconds (none: E2B's default for
    forks, 15 s) and how many (none: one; the bound is `activator.MAX_FORKS`)."""

    timeout: _Seconds | None = None
    count: int | None = None


class ForkResult(_Wire, kw_only=True):
    """One fork's outcome (`SandboxForkResult`): the sandbox, as create answers it, or why it failed."""

    sandbox: Sandbox | None = None
    error: ErrorBody | None = None


class SnapshotRequest(_Wire, kw_only=True):
    """`POST /sandboxes/{id}/snapshots` (`SandboxSnapshotRequest`): `name[:tag]` of the snapshot's template (none:
    named by its ID); `memory`: the SDK's `mode` ("full": true, "filesystem": false; none: the server's default)."""

    name: _TemplateName | None = None
    memory: bool | None = None


class SnapshotInfo(_Wire, kw_only=True):
    """E2B's `SnapshotInfo`: `snapshotID` is what `Sandbox.create` takes (`name:tag`); `names` its full names."""

    snapshot_id: str = msgspec.field(name="snapshotID")
    names: list[str]


class AgentSessionsKept(_Wire, kw_only=True):
    """`GET /sandboxes/{id}/agent-sessions` (ours, not E2B's): the control plane's copy of the sandbox's coding-agent
    sessions, newest first. `endedAt`: when the sandbox was killed (none: it lives); `truncated`: the copy reached
    its size limit, so the sessions' last events are missing from it."""

    sandbox_id: str = msgspec.field(name="sandboxID")
    sessions: list[SessionInfo]
    ended_at: datetime | None
    truncated: bool


class KeptAgentSession(_Wire, kw_only=True):
    """One entry of `GET /agent-sessions`: a session kept of one of the key's sandboxes, live or ended."""

    sandbox_id: str = msgspec.field(name="sandboxID")
    template_id: str = msgspec.field(name="templateID")
    session: SessionInfo
    sandbox_ended_at: datetime | None
