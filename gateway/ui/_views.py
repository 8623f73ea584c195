"""What the pages show, as plain JSON-ready structs built from the activator's records and figures.

The browser renders these (the live parts of every page come from the event streams in `_events`); times are
unix seconds and the snapshot carries the server's `now`, so ages and idle times tick in the browser between
snapshots without a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import Any

import msgspec

from activator import ActivatorError, BuildRecord, SandboxRecord, SandboxState
from gateway.ui._services import UiServices
from pool import SandboxStats, Template

__all__ = [
    "MAX_LISTED",
    "PoolView",
    "SandboxView",
    "TemplateView",
    "list_sandboxes",
    "one_sandbox",
    "own_template_views",
    "pool_views",
    "sandbox_view",
    "template_views",
]

MAX_LISTED = 500  # sandboxes one page shows (five pages of the activator's listing)
_ALL_REPORTED = (SandboxState.RUNNING, SandboxState.PAUSED)  # as E2B reports them: together, every live sandbox


class SandboxView(msgspec.Struct, kw_only=True):
    """One sandbox as the list and the detail page show it."""

    id: str
    state: str  # the record's own state: running / paused / snapshotted
    reported: str  # what the E2B API reports: an idle pause still reads as running
    pause_reason: str | None  # api / timeout / idle / crash, while not running
    crash: str | None  # why its processes ended by themselves, while it stays snapshotted after that
    snapshot_kind: str | None  # criu / filesystem, while snapshotted
    template: str
    alias: str
    metadata: dict[str, str]
    created_at: float
    started_at: float
    last_active: float  # the last traffic, or the last start / resume when none was seen since
    end_at: float | None  # when the TTL runs out, while it runs
    remaining: float | None  # the TTL left, while it is stopped (paused by the user or its timeout)
    on_timeout: str
    auto_resume: bool
    cpu_count: int
    cpu_pct: float | None
    mem_used: int | None
    mem_total: int
    ports: list[int]  # the ports the template declares


class PoolView(msgspec.Struct, kw_only=True):
    """One template's warm pool; `figures` are `pool.WarmPoolStats`' fields, whatever they are."""

    template: str
    figures: dict[str, Any]


class BuildView(msgspec.Struct, kw_only=True):
    """One build of a key's own template: its status and the end of its log."""

    build_id: str
    status: str
    tags: list[str]
    created_at: float
    finished_at: float | None
    reason: str
    reason_step: str | None
    logs: list[str]  # the last `_BUILD_LOG_LINES` entries, "[step] message"


class TemplateView(msgspec.Struct, kw_only=True):
    """One template, for the Templates page (rendered on the server)."""

    name: str
    aliases: list[str]
    description: str
    layers: list[str]
    env: dict[str, str]
    start: list[str]
    ports: list[int]
    user: str
    workdir: str
    resources: dict[str, int]
    warm: int
    pause_after: str
    snapshot_after: str
    template_id: str = ""  # a key's own template: its E2B templateID ("" for a built-in one)
    builds: list[BuildView] = []  # a key's own template: its builds, newest first


_BUILD_LOG_LINES = 200


async def list_sandboxes(
    services: UiServices, owner: str, *, states: Collection[str], metadata: Mapping[str, str]
) -> list[SandboxView]:
    """The key's live sandboxes in `states` (the records' own states; empty: all) with `metadata`, newest first."""
    activator = services.activator
    records: list[SandboxRecord] = []
    token: str | None = None
    while len(records) < MAX_LISTED:
        page = await activator.list(owner, states=_ALL_REPORTED, metadata=metadata, limit=100, next_token=token)
        records += [record for record in page.records if not states or record.state.value in states]
        token = page.next_token
        if token is None:
            break
    records = records[:MAX_LISTED]
    stats = await asyncio.gather(*(_stats(services, owner, record) for record in records))
    return [sandbox_view(services, record, figures) for record, figures in zip(records, stats, strict=True)]


async def one_sandbox(services: UiServices, owner: str, sandbox_id: str) -> SandboxView:
    """The sandbox with its current figures; SandboxNotFound when it is gone or another key's."""
    record = services.activator.get(owner, sandbox_id)
    return sandbox_view(services, record, await _stats(services, owner, record))


def sandbox_view(services: UiServices, record: SandboxRecord, stats: SandboxStats | None) -> SandboxView:
    last = services.last_activity(record.id) if services.last_activity is not None else 0.0
    template = services.activator.catalog.templates.get(record.template)
    ttl_stopped = record.user_paused
    return SandboxView(
        id=record.id, state=record.state.value, reported=record.reported_state.value,
        pause_reason=record.pause_reason, crash=record.crash, snapshot_kind=record.snapshot_kind,
        template=record.template,
        alias=record.alias, metadata=record.metadata, created_at=record.created_at, started_at=record.started_at,
        last_active=max(last, record.started_at), end_at=None if ttl_stopped else record.end_at,
        remaining=record.remaining if ttl_stopped else None, on_timeout=record.lifecycle.on_timeout,
        auto_resume=record.lifecycle.auto_resume, cpu_count=record.cpu_count,
        cpu_pct=stats.cpu_used_pct if stats else None, mem_used=stats.mem_used if stats else None,
        mem_total=stats.mem_total if stats and stats.mem_total else record.memory_mb << 20,
        ports=list(template.ports) if template else [],
    )  # fmt: skip


def pool_views(services: UiServices) -> list[PoolView] | None:
    """Each template's warm pool figures, or None when the server runs no warm pools."""
    if services.pool_stats is None:
        return None
    stats = services.pool_stats()
    return [PoolView(template=name, figures=msgspec.to_builtins(stats[name])) for name in sorted(stats)]


def template_views(services: UiServices) -> list[TemplateView]:
    """Every built-in template with its definition, its resources and its warm and idle settings."""
    pools = {view.template: view.figures for view in pool_views(services) or []}
    templates = services.activator.catalog.builtins()
    return [
        _template_view(services, name, template, int(pools.get(name, {}).get("target", template.warm)))
        for name, template in sorted(templates.items())
    ]


def own_template_views(services: UiServices, owner: str) -> list[TemplateView]:
    """The templates `owner` built (the E2B Template SDK), each as its newest ready build made it, with every
    build's status and log."""
    activator = services.activator
    views = []
    for record in activator.catalog.built(owner):
        builds = activator.template_builds.builds_of(owner, record.template_id)
        ready = next((b.template for b in builds if b.template is not None), None)
        view = _template_view(services, record.name, ready, 0) if ready else _unbuilt_view(record.name)
        tags = {build_id: [t for t, b in record.tags.items() if b == build_id] for build_id in record.tags.values()}
        view.template_id = record.template_id
        view.builds = [_build_view(build, tags.get(build.build_id, [])) for build in builds]
        views.append(view)
    return views


def _build_view(build: BuildRecord, tags: list[str]) -> BuildView:
    return BuildView(
        build_id=build.build_id, status=build.status, tags=tags, created_at=build.created_at,
        finished_at=build.finished_at, reason=build.reason, reason_step=build.reason_step,
        logs=[f"[{entry.step or '-'}] {entry.message}" for entry in build.logs[-_BUILD_LOG_LINES:]],
    )  # fmt: skip


def _unbuilt_view(name: str) -> TemplateView:
    return TemplateView(
        name=name, aliases=[], description="", layers=[], env={}, start=[], ports=[], user="", workdir="",
        resources={}, warm=0, pause_after="", snapshot_after="",
    )  # fmt: skip


def _template_view(services: UiServices, name: str, template: Template, warm: int) -> TemplateView:
    catalog, settings = services.activator.catalog, services.activator.settings
    return TemplateView(
        name=name, aliases=catalog.names_of(name)[1:], description=template.description,
        layers=[_layer(layer) for layer in template.layers], env=template.env, start=list(template.start),
        ports=list(template.ports), user=template.user, workdir=template.workdir,
        resources=msgspec.to_builtins(template.resources), warm=warm,
        pause_after=_seconds(settings.pause_after, template.pause_after),
        snapshot_after=_seconds(settings.snapshot_after, template.snapshot_after),
    )  # fmt: skip


async def _stats(services: UiServices, owner: str, record: SandboxRecord) -> SandboxStats | None:
    """The sandbox's cgroup figures, or None when it has no processes or just went away."""
    if record.state is SandboxState.SNAPSHOTTED:
        return None
    try:
        return (await services.activator.metrics(owner, record.id))[1]
    except ActivatorError:
        return None


def _layer(layer: Any) -> str:
    fields = msgspec.to_builtins(layer)
    kind = fields.pop("kind", type(layer).__name__)
    packages = fields.pop("packages", [])
    details = [f"{key}={value}" for key, value in fields.items() if key != "mirror"]
    return " ".join([kind, *details, *(["· " + ", ".join(packages)] if packages else [])])


def _seconds(server: float | None, template: float | None) -> str:
    """The idle step's threshold as the reaper applies it: the server's flag wins over the template's own."""
    value = server if server is not None else template
    if not value:
        return "never"
    return f"{value:g} s" + (" (server)" if server is not None else "")
