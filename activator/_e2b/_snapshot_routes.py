"""E2B's snapshots (e2b-features.md §3): `create_snapshot`, `list_snapshots`; `delete_snapshot` is a template
delete (`_template_routes`), and `Sandbox.create(<snapshot id>)` a create from the template it is.

`mode="full"` (`memory: true`) keeps the sandbox's memory and files (sandboxes created from it go on from there,
as forks; 501 where memory is never imaged), `mode="filesystem"` (`memory: false`) its files only, and the API's
default (no `memory`, as the JS SDK 2.45 sends) is E2B's: memory where it can be imaged, files otherwise
(`Activator.create_snapshot`).
"""

from __future__ import annotations

from typing import Annotated

from litestar import Response, get, post
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody, QueryParameter

from activator._catalog import DEFAULT_TAG, split_reference
from activator._e2b import _convert, _wire
from activator._e2b._info_routes import NEXT_TOKEN
from activator._e2b._openapi import keyed_errors
from activator._e2b._state import ActivatorDep, OwnerDep, SandboxIdPath
from activator._errors import InvalidRequest
from activator._template_records import TemplateRecord

__all__ = ["SNAPSHOT_ROUTES"]


@post("/sandboxes/{sandbox_id:str}/snapshots", status_code=201, responses=keyed_errors(400, 404, 409, 413, 501))
async def create_snapshot(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    data: JSONBody[_wire.SnapshotRequest | None] = None,
) -> _wire.SnapshotInfo:
    """Snapshot the sandbox's files (with `memory: true`, its memory too) as a template (`name[:tag]`, or one
    named by its ID); it runs on. 501 for memory where it is never imaged, 409 while it is paused."""
    options = data or _wire.SnapshotRequest()
    name, tag = split_reference(options.name or "")
    if options.name is not None:
        _convert.check_template_name(name)
    record = await activator.create_snapshot(owner, sandbox_id, name, tag or DEFAULT_TAG, memory=options.memory)
    return _snapshot_info(record, tag or DEFAULT_TAG)


@get("/snapshots", responses=keyed_errors(400), response_headers=[NEXT_TOKEN])
async def list_snapshots(
    activator: ActivatorDep,
    owner: OwnerDep,
    sandbox_id: Annotated[str | None, QueryParameter(name="sandboxID", max_length=64)] = None,
    name: Annotated[str | None, QueryParameter(max_length=200)] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=100)] = 100,
    next_token: Annotated[str | None, QueryParameter(name="nextToken", max_length=64)] = None,
) -> Response[list[_wire.SnapshotInfo]]:
    """The key's snapshots, oldest first (of one sandbox, or of one name); `X-Next-Token` when more follow (a
    place in the listing, not a snapshot: deleting one while paging loses nothing)."""
    found = activator.snapshots(owner, sandbox_id=sandbox_id or "", name=split_reference(name or "")[0])
    after = _decode_token(next_token) if next_token else None
    if after is not None:
        found = [record for record in found if (record.created_at, record.template_id) > after]
    page = found[:limit]
    headers = {"X-Next-Token": _token(page[-1])} if len(found) > limit else {}
    builds = activator.template_builds
    return Response([_snapshot_info(record, builds.newest_tag(record)) for record in page], headers=headers)


def _token(record: TemplateRecord) -> str:
    return f"{record.created_at!r}~{record.template_id}"


def _decode_token(token: str) -> tuple[float, str]:
    created_at, _, template_id = token.partition("~")
    try:
        return float(created_at), template_id
    except ValueError:
        raise InvalidRequest(f"nextToken {token!r} is not one this listing gave") from None


def _snapshot_info(record: TemplateRecord, tag: str) -> _wire.SnapshotInfo:
    """E2B's answer: the reference `Sandbox.create` takes (`tag`'s), and the template's names (each tag's)."""
    tags = sorted(record.tags, key=lambda t: (t != tag, t))
    return _wire.SnapshotInfo(snapshot_id=f"{record.name}:{tag}", names=[f"{record.name}:{t}" for t in tags])


SNAPSHOT_ROUTES: list[HTTPRouteHandler] = [create_snapshot, list_snapshots]
