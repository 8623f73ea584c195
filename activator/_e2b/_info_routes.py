"""E2B endpoints that only read: sandbox info, listings, metrics, logs, templates, and health (§2.4, §2.5)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from litestar import Response, get
from litestar.datastructures import ResponseHeader
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, QueryParameter

from activator._catalog import split_reference
from activator._e2b import _convert, _wire
from activator._e2b._openapi import keyed_errors
from activator._e2b._query import decode_metadata_filter, decode_states
from activator._e2b._state import ActivatorDep, OwnerDep, SandboxIdPath
from activator._logs import LOG_LEVELS, LogLevel, LogLine
from activator._records import SandboxState

__all__ = ["INFO_ROUTES", "NEXT_TOKEN", "PUBLIC_INFO_ROUTES"]

_Limit = Annotated[int, QueryParameter(ge=1, le=100)]
_LogLimit = Annotated[int, QueryParameter(ge=0, le=1000)]
_Millis = Annotated[int | None, QueryParameter(ge=0)]


@get("/health", sync_to_thread=False)
def health(activator: ActivatorDep) -> dict[str, object]:
    """Liveness of the control plane, with details (sandboxes by state, held requests, CRIU); needs no API key."""
    return {"status": "ok", **activator.health()}


@get("/sandboxes/{sandbox_id:str}", responses=keyed_errors(400, 404))
async def get_sandbox(sandbox_id: SandboxIdPath, activator: ActivatorDep, owner: OwnerDep) -> _wire.SandboxDetail:
    """One sandbox; 404 when unknown, killed, or another key's."""
    return _convert.sandbox_detail(await activator.lookup(owner, sandbox_id))


NEXT_TOKEN = ResponseHeader(name="X-Next-Token", documentation_only=True, description="the next page's token")


@get("/v2/sandboxes", responses=keyed_errors(400), response_headers=[NEXT_TOKEN])
async def list_v2(
    activator: ActivatorDep,
    owner: OwnerDep,
    metadata: FromQuery[str | None] = None,
    states: Annotated[str | None, QueryParameter(name="state")] = None,
    template: FromQuery[str | None] = None,
    started_after: Annotated[datetime | None, QueryParameter(name="startedAfter")] = None,
    next_token: Annotated[str | None, QueryParameter(name="nextToken")] = None,
    limit: _Limit = 100,
    order: FromQuery[Literal["asc", "desc"]] = "desc",
) -> Response[list[_wire.ListedSandbox]]:
    """A page of running and paused sandboxes; `X-Next-Token` is set only when another page follows."""
    page = await activator.list(
        owner,
        states=decode_states(states),
        metadata=decode_metadata_filter(metadata),
        template=template,
        started_after=_aware(started_after),
        limit=limit,
        next_token=next_token,
        order=order,
    )
    headers = {"X-Next-Token": page.next_token} if page.next_token else {}
    return Response([_convert.sandbox_listed(r) for r in page.records], headers=headers)


@get("/sandboxes", responses=keyed_errors(400))
async def list_v1(
    activator: ActivatorDep, owner: OwnerDep, metadata: FromQuery[str | None] = None
) -> list[_wire.ListedSandbox]:
    """Running sandboxes (deprecated v1): the first 100, newest first."""
    page = await activator.list(owner, states={SandboxState.RUNNING}, metadata=decode_metadata_filter(metadata))
    return [_convert.sandbox_listed(r) for r in page.records]


@get("/sandboxes/{sandbox_id:str}/metrics", responses=keyed_errors(400, 404))
async def metrics(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    start: FromQuery[int | None] = None,
    end: FromQuery[int | None] = None,
) -> list[_wire.SandboxMetric]:
    """The kept samples within [start, end] (unix seconds, compared in whole seconds), oldest first: one per 5 s
    while the sandbox runs, the last 10 minutes (`activator._metrics_ring`)."""
    samples = await activator.metrics_between(owner, sandbox_id, start, end)
    return [_convert.metric(sample.at, sample.stats) for sample in samples]


@get("/sandboxes/{sandbox_id:str}/logs", responses=keyed_errors(400, 404), sync_to_thread=False)
def logs_v1(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    start: _Millis = None,
    limit: _LogLimit = 1000,
) -> _wire.LogsV1:
    """Lifecycle lines from `start` (unix ms) on, oldest first."""
    lines = [line for line in activator.logs(owner, sandbox_id) if start is None or line.timestamp * 1000 >= start]
    lines = lines[:limit]
    return _wire.LogsV1(
        logs=[_convert.log_line(line) for line in lines], log_entries=[_convert.log_entry(line) for line in lines]
    )


@get("/v2/sandboxes/{sandbox_id:str}/logs", responses=keyed_errors(400, 404), sync_to_thread=False)
def logs_v2(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    cursor: _Millis = None,
    limit: _LogLimit = 1000,
    direction: FromQuery[Literal["forward", "backward"]] = "forward",
    level: FromQuery[LogLevel] = "debug",
    search: Annotated[str | None, QueryParameter(max_length=256)] = None,
) -> _wire.LogsV2:
    """Lifecycle entries at or above `level` containing `search`, from `cursor` (unix ms) in `direction`."""
    lines = activator.logs(owner, sandbox_id)
    if direction == "backward":
        lines.reverse()
    wanted = [
        line
        for line in lines
        if LOG_LEVELS.index(line.level) >= LOG_LEVELS.index(level)
        and (search is None or search in line.message)
        and (cursor is None or _from_cursor(line, cursor, direction))
    ]
    return _wire.LogsV2(logs=[_convert.log_entry(line) for line in wanted[:limit]])


@get(["/templates", "/v2/templates"], responses=keyed_errors(), sync_to_thread=False)
def templates(activator: ActivatorDep, owner: OwnerDep) -> list[_wire.TemplateOut]:
    """The built-in templates, shared by all keys, then the key's own, each with its latest build."""
    catalog, settings = activator.catalog, activator.settings
    builtins = [
        _convert.template(tpl, catalog.names_of(name), loaded_at=catalog.loaded_at, settings=settings)
        for name, tpl in sorted(catalog.builtins().items())
    ]
    own = [
        _convert.built_template(record, activator.template_builds.latest(record.template_id), settings=settings)
        for record in catalog.built(owner)
    ]
    return builtins + own


@get("/templates/aliases/{alias:str}", responses=keyed_errors(400, 404), sync_to_thread=False)
def template_alias(alias: FromPath[str], activator: ActivatorDep, owner: OwnerDep) -> _wire.TemplateAlias:
    """The template a name or alias (`name:tag`) names: the key's own (not public) or a built-in one; 404 when
    none does (`Template.exists()` is then False)."""
    catalog = activator.catalog
    own = catalog.find_built(owner, split_reference(alias)[0])
    if own is not None:
        return _wire.TemplateAlias(template_id=own.template_id, public=False)
    return _wire.TemplateAlias(template_id=catalog.resolve(alias).name, public=True)


def _aware(moment: datetime | None) -> datetime | None:
    """A query time without an offset is UTC (the SDK sends one; curl users may not)."""
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _from_cursor(line: LogLine, cursor: int, direction: Literal["forward", "backward"]) -> bool:
    millis = line.timestamp * 1000
    return millis >= cursor if direction == "forward" else millis <= cursor


PUBLIC_INFO_ROUTES: list[HTTPRouteHandler] = [health]
INFO_ROUTES: list[HTTPRouteHandler] = [
    get_sandbox,
    list_v2,
    list_v1,
    metrics,
    logs_v1,
    logs_v2,
    templates,
    template_alias,
]
