"""E2B's template-build routes, as the Template SDK calls them (e2b-features.md §1.2): request a build, upload
a COPY step's files, start the build, poll its status and logs; tags and deletion of a key's own templates.

The upload URL is the one route without an API key (the SDK's PUT sends none): it authorises itself with the
token `TemplateFiles` signs into it, and streams the body to disk under its own size limit.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, delete, get, post, put
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from activator._catalog import DEFAULT_TAG, split_reference
from activator._e2b import _convert, _wire
from activator._e2b._openapi import errors, keyed_errors
from activator._e2b._state import ActivatorDep, OwnerDep
from activator._e2b._template_steps import BaseRefused, BuildStart, plan_build
from activator._errors import ActivatorError, InvalidRequest
from activator._logs import LogLevel
from activator._template_builds import BuildFailure, BuildPlan
from activator._template_files import MAX_TEMPLATE_FILES_BYTES
from pool import Resources, Template

__all__ = ["PUBLIC_TEMPLATE_ROUTES", "TEMPLATE_ROUTES"]

_Hash = Annotated[str, QueryParameter(pattern=r"^[0-9a-f]{64}$")]
_BUILD = "/templates/{template_id:str}/builds/{build_id:str}"
_FILES = "/templates/{template_id:str}/files/{files_hash:str}"
# A change to a key's templates: also refused (501) where this server builds none (`TemplateBuilds.refusal`).
_CHANGE = keyed_errors(400, 404, 413, 501)


@post("/v3/templates", status_code=202, responses=keyed_errors(400, 413, 501))
async def request_build(
    data: JSONBody[_wire.TemplateBuildRequest], activator: ActivatorDep, owner: OwnerDep
) -> _wire.TemplateBuildRequested:
    """Register a waiting build of `name[:tag]` (the template is made when the key has none of that name)."""
    reference = data.name or data.alias
    if not reference:
        raise InvalidRequest("a template build needs a name")
    if data.min_free_disk_mb:  # 0 asks for no growth, which is what happens
        raise InvalidRequest(
            "minFreeDiskMb is not supported by this server: a sandbox's disk is not grown (nor limited)"
        )
    name, tag = split_reference(reference)
    _convert.check_template_name(name)
    tags = list(dict.fromkeys([*([tag] if tag else []), *data.tags])) or [DEFAULT_TAG]
    builds = activator.template_builds
    record, build = await builds.request(owner, name, tags, cpu_count=data.cpu_count, memory_mb=data.memory_mb)
    return _wire.TemplateBuildRequested(
        template_id=record.template_id, build_id=build.build_id, public=False, names=[name], tags=tags,
        aliases=[name],
    )  # fmt: skip


@get(_FILES, status_code=201, responses=keyed_errors(400, 404), sync_to_thread=False)
def files_link(
    request: Request[Any, Any, Any], template_id: FromPath[str], files_hash: _Hash, activator: ActivatorDep,
    owner: OwnerDep,
) -> _wire.TemplateFilesLink:  # fmt: skip
    """Whether the key's files for a COPY step are here; if not, the URL (signed, no key needed) to PUT them to."""
    builds = activator.template_builds
    builds.template(owner, template_id)
    files = builds.files
    assert files is not None  # `template` refused otherwise
    if files.has(owner, files_hash):
        return _wire.TemplateFilesLink(present=True)
    query = f"key={owner}&token={files.token(owner, files_hash)}"
    base = str(request.base_url).rstrip("/")
    return _wire.TemplateFilesLink(present=False, url=f"{base}/templates/{template_id}/files/{files_hash}?{query}")


@put(
    _FILES, status_code=201, request_max_body_size=MAX_TEMPLATE_FILES_BYTES, media_type="application/json",
    responses=errors(400, 403, 413),
)  # fmt: skip
async def upload_files(
    request: Request[Any, Any, Any], files_hash: _Hash, key: FromQuery[str], token: FromQuery[str],
    activator: ActivatorDep,
) -> dict[str, int]:  # fmt: skip
    """The SDK's upload of a COPY step's tar: authorised by the token in its URL, streamed to disk."""
    files = activator.template_builds.files
    if files is None or not files.check(key, files_hash, token):
        raise _Forbidden("this upload URL is not valid")
    return {"size": await files.receive(key, files_hash, request.stream())}


@post(["/v2" + _BUILD, _BUILD], status_code=202, responses=_CHANGE)
async def start_build(
    template_id: FromPath[str],
    build_id: FromPath[str],
    data: JSONBody[BuildStart],
    activator: ActivatorDep,
    owner: OwnerDep,
) -> None:
    """Start a waiting build with its steps; what the steps make is built in the background."""
    builds = activator.template_builds
    build = builds.build(owner, template_id, build_id)
    resources = Resources(cpu_count=build.cpu_count, memory_mb=build.memory_mb)
    base_disk = activator.catalog.templates.get("base")
    if base_disk is not None:
        resources = msgspec.structs.replace(resources, disk_mb=base_disk.resources.disk_mb)

    def resolve(reference: str) -> Template:
        return activator.catalog.resolve(reference, owner)

    failure: BuildFailure | None = None
    try:  # malformed steps are a 400 now; a base that cannot be had fails the build at its line (`base`)
        planned = plan_build(data, name=template_id, build_id=build_id, resources=resources, resolve=resolve)
    except BaseRefused as exc:
        failure = BuildFailure(str(exc), "base")

    def plan() -> BuildPlan:
        if failure is not None:
            raise failure
        return planned

    await builds.start(owner, template_id, build_id, plan)


@get(_BUILD + "/status", responses=keyed_errors(400, 404), sync_to_thread=False)
def build_status(
    template_id: FromPath[str], build_id: FromPath[str], activator: ActivatorDep, owner: OwnerDep,
    logs_offset: Annotated[int, QueryParameter(name="logsOffset", ge=0)] = 0,
    limit: Annotated[int, QueryParameter(ge=0, le=100)] = 100,
    level: FromQuery[LogLevel | None] = None,
) -> _wire.TemplateBuildStatus:  # fmt: skip
    """The build's status and its log entries from `logsOffset` on (at most `limit`, E2B's 100)."""
    build = activator.template_builds.build(owner, template_id, build_id)
    return _convert.build_status(build, offset=logs_offset, limit=limit, level=level)


@get("/templates/{template_id:str}/tags", responses=keyed_errors(400, 404), sync_to_thread=False)
def template_tags(template_id: FromPath[str], activator: ActivatorDep, owner: OwnerDep) -> list[_wire.TemplateTagOut]:
    """The tags of the key's template (by name or ID) and the build each one names."""
    builds = activator.template_builds
    record = builds.template(owner, split_reference(template_id)[0])
    return [
        _convert.tag(tag, builds.build(owner, record.template_id, build_id)) for tag, build_id in record.tags.items()
    ]


@post("/templates/tags", status_code=201, responses=_CHANGE)
async def assign_tags(data: JSONBody[_wire.AssignTags], activator: ActivatorDep, owner: OwnerDep) -> _wire.AssignedTags:
    """Point `tags` at the build that `target` (`name[:tag]`) names."""
    build_id = await activator.template_builds.assign_tags(owner, data.target, data.tags)
    return _wire.AssignedTags(build_id=build_id, tags=data.tags)


@delete("/templates/tags", status_code=204, responses=_CHANGE)
async def remove_tags(data: JSONBody[_wire.RemoveTags], activator: ActivatorDep, owner: OwnerDep) -> None:
    """Remove `tags` from the key's template `name` (its builds stay)."""
    await activator.template_builds.remove_tags(owner, split_reference(data.name)[0], data.tags)


@delete("/templates/{template_id:str}", status_code=204, responses=keyed_errors(400, 403, 404, 501))
async def delete_template(template_id: FromPath[str], activator: ActivatorDep, owner: OwnerDep) -> None:
    """Delete the key's template and its builds; a built-in one is the operator's (403)."""
    name = split_reference(template_id)[0]
    if activator.catalog.is_builtin(name) and activator.catalog.find_built(owner, name) is None:
        raise _Forbidden(f"template '{name}' is built in (the operator's); it cannot be deleted")
    await activator.delete_template(owner, name)


class _Forbidden(ActivatorError):
    status_code = 403


PUBLIC_TEMPLATE_ROUTES: list[HTTPRouteHandler] = [upload_files]
TEMPLATE_ROUTES: list[HTTPRouteHandler] = [
    request_build, files_link, start_build, build_status, template_tags, assign_tags, remove_tags, delete_template,
]  # fmt: skip
