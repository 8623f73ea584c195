"""Translations between the activator's own types and E2B's wire structs."""

from __future__ import annotations

import re
import uuid
from typing import Literal

import msgspec

from activator._e2b import _wire
from activator._errors import InvalidRequest
from activator._logs import LOG_LEVELS, LogLevel, LogLine
from activator._network import check_private_ingress, egress_in_force, https_ports, mask_host
from activator._records import CreateRequest, Egress, Lifecycle, SandboxRecord, SandboxState, record_time
from activator._settings import ActivatorSettings
from activator._template_records import BuildLogEntry, BuildRecord, TemplateRecord
from activator._volumes import check_mount_paths
from pool import SandboxStats, Template

__all__ = [
    "WIRE_STATES",
    "WireState",
    "build_log_entry",
    "build_status",
    "built_template",
    "check_template_name",
    "create_request",
    "log_entry",
    "log_line",
    "metric",
    "network_update",
    "sandbox",
    "sandbox_detail",
    "sandbox_listed",
    "tag",
    "template",
]

WireState = Literal["running", "paused"]

# E2B's states -> the states we report (`SandboxRecord.reported_state`): a sandbox paused or snapshotted by the
# idle policy reports `running`, one paused by the user (E2B pause, or its timeout) reports `paused`.
WIRE_STATES: dict[WireState, frozenset[SandboxState]] = {
    "running": frozenset({SandboxState.RUNNING}),
    "paused": frozenset({SandboxState.PAUSED}),
}
_WIRE_STATE: dict[SandboxState, WireState] = {state: wire for wire, states in WIRE_STATES.items() for state in states}


def create_request(
    body: _wire.NewSandbox, *, default_timeout: int, default_secure: bool, default_internet: bool = True
) -> CreateRequest:
    """A create body with the endpoint's defaults applied (v2: 300 s and always secure; v1: 15 s, `secure`) and
    the server's (`default_internet`: what leaving `allow_internet_access` out means; off is reported as false)."""
    auto_resume = body.auto_resume.enabled if body.auto_resume else False
    on_timeout: Literal["kill", "pause"] = "pause" if body.auto_pause else "kill"
    if body.lifecycle:
        on_timeout = body.lifecycle.on_timeout or on_timeout
        auto_resume = auto_resume if body.lifecycle.auto_resume is None else body.lifecycle.auto_resume
    network = body.network or _wire.NetworkIn()
    _refuse_unserved(network, iam=body.iam)
    mounts = check_mount_paths((mount.name, mount.path) for mount in body.volume_mounts or ())
    secure = default_secure if body.secure is None else body.secure
    public = network.allow_public_traffic is not False
    check_private_ingress(public=public, secure=secure)
    internet = body.allow_internet_access
    if internet is None and not default_internet:
        internet = False
    return CreateRequest(
        template=body.template_id,
        timeout=default_timeout if body.timeout is None else body.timeout,
        metadata=body.metadata or {},
        env_vars=body.env_vars or {},
        secure=secure,
        lifecycle=Lifecycle(on_timeout=on_timeout, auto_resume=auto_resume),
        allow_internet_access=internet,
        egress=egress_in_force(network.allow_out, network.deny_out, allow_internet_access=internet),
        public_traffic=public,
        mask_request_host=None if network.mask_request_host is None else mask_host(network.mask_request_host),
        https_ports=https_ports(network.https_ports or ()),
        volume_mounts=mounts,
    )


def network_update(body: _wire.NetworkUpdate) -> Egress:
    """The egress rules an `update_network` puts in force (everything it omits is cleared, as on E2B)."""
    _refuse_unserved(body)
    return egress_in_force(body.allow_out, body.deny_out, allow_internet_access=body.allow_internet_access)


def _refuse_unserved(network: _wire.NetworkIn | _wire.NetworkUpdate, *, iam: object = None) -> None:
    """Options nothing here carries out: per-host header rules and a SOCKS5 hop need an egress proxy that
    rewrites and tunnels, DNS servers a resolver that forwards to them."""
    unserved = {
        "network.rules": network.rules,
        "network.egressProxy": network.egress_proxy,
        "network.dnsServers": network.dns_servers,
        "iam": iam,
    }
    for name, value in unserved.items():
        if value is not None:
            raise InvalidRequest(f"{name} is not supported by this server")


def template_id(record: SandboxRecord) -> str:
    """E2B's `templateID` of a sandbox: a built-in's name, or a key's template's ID without its build."""
    return record.template.partition("/")[0]


def sandbox(record: SandboxRecord) -> _wire.Sandbox:
    """The answer to create, connect and resume."""
    return _wire.Sandbox(
        template_id=template_id(record),
        sandbox_id=record.id,
        client_id=record.client_id,
        envd_version=record.envd_version,
        traffic_access_token=record.ingress.traffic_access_token,
        domain=record.domain,
        alias=record.alias,
        envd_access_token=record.access_token,
    )


def sandbox_listed(record: SandboxRecord) -> _wire.ListedSandbox:
    """One item of a listing."""
    return _wire.ListedSandbox(
        template_id=template_id(record),
        sandbox_id=record.id,
        client_id=record.client_id,
        started_at=record_time(record.started_at),
        end_at=record_time(record.end_at),
        cpu_count=record.cpu_count,
        memory_mb=record.memory_mb,
        disk_size_mb=record.disk_mb,
        state=_WIRE_STATE[record.reported_state],
        envd_version=record.envd_version,
        metadata=record.metadata,
        alias=record.alias,
    )


def sandbox_detail(record: SandboxRecord) -> _wire.SandboxDetail:
    """The answer to GET /sandboxes/{id}: the listing's fields and the sandbox's settings."""
    return _wire.SandboxDetail(
        **msgspec.structs.asdict(sandbox_listed(record)),
        domain=record.domain,
        allow_internet_access=record.allow_internet_access,
        lifecycle=_wire.LifecycleOut(auto_resume=record.lifecycle.auto_resume, on_timeout=record.lifecycle.on_timeout),
        network=_wire.NetworkOut(
            allow_public_traffic=record.ingress.public,
            allow_out=list(record.egress.allow_out) or None,
            deny_out=list(record.egress.deny_out) or None,
            mask_request_host=record.ingress.mask_request_host,
            https_ports=list(record.ingress.https_ports) or None,
        ),
        volume_mounts=[_wire.VolumeMountIn(name=mount.name, path=mount.path) for mount in record.volumes],
        envd_access_token=record.access_token,
    )


def metric(at: float, stats: SandboxStats) -> _wire.SandboxMetric:
    """One metrics sample."""
    return _wire.SandboxMetric(
        timestamp=record_time(at),
        timestamp_unix=int(at),
        cpu_count=stats.cpu_count,
        cpu_used_pct=stats.cpu_used_pct,
        mem_used=stats.mem_used,
        mem_total=stats.mem_total,
        mem_cache=stats.mem_cache,
        disk_used=stats.disk_used,
        disk_total=stats.disk_total,
    )


def log_line(line: LogLine) -> _wire.LogLine:
    """A v1 plain log line."""
    return _wire.LogLine(timestamp=record_time(line.timestamp), line=line.message)


def log_entry(line: LogLine) -> _wire.LogEntry:
    """A structured log entry (v1 `logEntries`, v2 `logs`)."""
    return _wire.LogEntry(timestamp=record_time(line.timestamp), level=line.level, message=line.message, fields={})


def template(tpl: Template, names: list[str], *, loaded_at: float, settings: ActivatorSettings) -> _wire.TemplateOut:
    """A template as E2B lists it: shared by every key (`public`), built once (`ready`), its name as its ID."""
    return _wire.TemplateOut(
        template_id=tpl.name,
        build_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"agent-sandbox:template:{tpl.name}")),
        cpu_count=tpl.resources.cpu_count,
        memory_mb=tpl.resources.memory_mb,
        disk_size_mb=tpl.resources.disk_mb,
        public=True,
        aliases=names,
        names=names,
        created_at=record_time(loaded_at),
        updated_at=record_time(loaded_at),
        created_by=None,
        last_spawned_at=None,
        spawn_count=0,
        build_count=1,
        envd_version=settings.envd_version,
        build_status="ready",
        description=tpl.description or None,
    )


_TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


def check_template_name(name: str) -> None:
    """A template name as E2B accepts it: lowercase letters, digits, `.`, `_` and `-` (400 otherwise)."""
    if not _TEMPLATE_NAME.match(name):
        raise InvalidRequest(
            f"template name {name!r} is invalid: use 1 to 128 of a-z, 0-9, '.', '_' and '-', starting with a letter "
            "or digit"
        )


def build_status(build: BuildRecord, *, offset: int, limit: int, level: LogLevel | None) -> _wire.TemplateBuildStatus:
    """A build's status with its log entries `offset`.. (at most `limit`), and on error the failing step's
    warnings and errors (E2B's `reason.logEntries`)."""
    entries = [e for e in build.logs if level is None or LOG_LEVELS.index(e.level) >= LOG_LEVELS.index(level)]
    page = [build_log_entry(e) for e in entries[offset : offset + limit]]
    reason = None
    if build.status == "error":
        failed = [
            build_log_entry(e) for e in build.logs if e.step == build.reason_step and e.level in ("warn", "error")
        ]
        reason = _wire.BuildReason(message=build.reason, step=build.reason_step, log_entries=failed)
    return _wire.TemplateBuildStatus(
        template_id=build.template_id, build_id=build.build_id, status=build.status,
        logs=[f"{e.timestamp.isoformat()} {e.message}" for e in page], log_entries=page, reason=reason,
    )  # fmt: skip


def build_log_entry(entry: BuildLogEntry) -> _wire.BuildLogEntryOut:
    return _wire.BuildLogEntryOut(
        timestamp=record_time(entry.timestamp), level=entry.level, message=entry.message, step=entry.step
    )


def tag(name: str, build: BuildRecord) -> _wire.TemplateTagOut:
    return _wire.TemplateTagOut(tag=name, build_id=build.build_id, created_at=record_time(build.created_at))


def built_template(
    record: TemplateRecord, build: BuildRecord | None, *, settings: ActivatorSettings
) -> _wire.TemplateOut:
    """A key's own template as E2B lists it: its latest build's figures and status."""
    tpl = build.template if build is not None else None
    resources = tpl.resources if tpl is not None else None
    return _wire.TemplateOut(
        template_id=record.template_id,
        build_id=build.build_id if build is not None else "",
        cpu_count=resources.cpu_count if resources else (build.cpu_count if build else 0),
        memory_mb=resources.memory_mb if resources else (build.memory_mb if build else 0),
        disk_size_mb=resources.disk_mb if resources else 0,
        public=False,
        aliases=[record.name],
        names=[record.name],
        created_at=record_time(record.created_at),
        updated_at=record_time(record.updated_at),
        created_by=None,
        last_spawned_at=None,
        spawn_count=0,
        build_count=1,
        envd_version=settings.envd_version,
        build_status=build.status if build is not None else "waiting",
    )
