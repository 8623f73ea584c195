"""E2B endpoints that change a sandbox: create, kill, timeout, refresh, pause, connect, resume (§2.4).

Both API generations are served: the Python SDK 2.63 uses `/v2/sandboxes` and `/v2/sandboxes/{id}/connect`,
the JS SDK and CLI the v1 paths. Success codes are exact (the SDK parses only documented ones).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import MediaType, Request, Response, delete, post
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.params import HeaderParameter, JSONBody

from activator._e2b import _convert, _wire
from activator._e2b._openapi import keyed_errors
from activator._e2b._state import ActivatorDep, OwnerDep, SandboxIdPath

__all__ = ["LIFECYCLE_ROUTES"]

_AnyRequest = Request[Any, Any, Any]
# E2B's header (the SDK sends it on creates and their retries); checked by `_idempotency`, None: no key.
_IdempotencyKey = Annotated[str | None, HeaderParameter(name="Idempotency-Key")]
_encode = msgspec.json.Encoder().encode
_CREATED = ResponseSpec(_wire.Sandbox, description="Created", generate_examples=False)
_RUNNING = ResponseSpec(_wire.Sandbox, description="Running", generate_examples=False)
# What every route of one sandbox may answer: a malformed id or body, no such sandbox (of this key), a body over
# the limit, and the key check's answers.
_BY_ID = keyed_errors(400, 404, 413)


@post(
    ["/v2/sandboxes", "/sandboxes"], status_code=201,
    responses={201: _CREATED, **keyed_errors(400, 404, 409, 413, 422)},
)  # fmt: skip
async def create(
    request: _AnyRequest,
    data: JSONBody[_wire.NewSandbox],
    activator: ActivatorDep,
    owner: OwnerDep,
    idempotency_key: _IdempotencyKey = None,
) -> Response[bytes]:
    """Create, at most once per `Idempotency-Key` (the same key and body replay the first answer). v2: 300 s
    default timeout, always secured with an envd access token; v1: 15 s, an envd access token only when `secure`."""
    v2, settings = request.url.path.startswith("/v2/"), activator.settings
    wanted = _convert.create_request(
        data,
        default_timeout=settings.default_timeout if v2 else settings.default_timeout_v1,
        default_secure=v2,
        default_internet=settings.default_internet,
    )

    async def answer() -> bytes:
        return _encode(_convert.sandbox(await activator.create(owner, wanted)))

    sent = (request.url.path, await request.body())
    return Response(
        await activator.once(owner, idempotency_key, sent, answer), status_code=201, media_type=MediaType.JSON
    )


@delete("/sandboxes/{sandbox_id:str}", status_code=204, responses=keyed_errors(400, 404))
async def kill(sandbox_id: SandboxIdPath, activator: ActivatorDep, owner: OwnerDep) -> None:
    """Kill; 404 once it is gone (the SDK's `kill()` then returns False)."""
    await activator.kill(owner, sandbox_id)


@post("/sandboxes/{sandbox_id:str}/timeout", status_code=204, responses=_BY_ID)
async def set_timeout(
    sandbox_id: SandboxIdPath, data: JSONBody[_wire.TimeoutRequest], activator: ActivatorDep, owner: OwnerDep
) -> None:
    """Expire `timeout` seconds from now."""
    await activator.set_timeout(owner, sandbox_id, data.timeout)


@post("/sandboxes/{sandbox_id:str}/refreshes", status_code=204, responses=_BY_ID)
async def refresh(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    data: JSONBody[_wire.RefreshRequest | None] = None,
) -> None:
    """Keep alive for at least `duration` seconds more (default: the v1 timeout)."""
    duration = data.duration if data and data.duration is not None else activator.settings.default_timeout_v1
    await activator.refresh(owner, sandbox_id, duration)


@post("/sandboxes/{sandbox_id:str}/pause", status_code=204, responses=keyed_errors(400, 404, 409, 413, 503))
async def pause(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    data: JSONBody[_wire.PauseRequest | None] = None,
) -> None:
    """Pause; 409 when already paused (the SDK's `pause()` then returns False). `memory: false` keeps files only;
    `requireHealthyGuest` answers 503 and leaves it running when its executor does not answer."""
    options = data or _wire.PauseRequest()
    await activator.pause(owner, sandbox_id, memory=options.memory, healthy_guest=options.require_healthy_guest)


@post(
    ["/v2/sandboxes/{sandbox_id:str}/connect", "/sandboxes/{sandbox_id:str}/connect"],
    responses={200: _RUNNING, 201: _CREATED, **_BY_ID},
)
async def connect(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    data: JSONBody[_wire.ConnectRequest | None] = None,
) -> Response[_wire.Sandbox]:
    """Connect: 201 when it resumed a paused sandbox, 200 when it was running (its TTL only lengthened)."""
    timeout = data.timeout if data and data.timeout is not None else activator.settings.default_timeout
    record, resumed = await activator.connect(owner, sandbox_id, timeout, memory=data.memory if data else True)
    return Response(_convert.sandbox(record), status_code=201 if resumed else 200)


@post("/sandboxes/{sandbox_id:str}/resume", status_code=201, responses=keyed_errors(400, 404, 409, 413))
async def resume(
    sandbox_id: SandboxIdPath,
    activator: ActivatorDep,
    owner: OwnerDep,
    data: JSONBody[_wire.ResumeRequest | None] = None,
) -> _wire.Sandbox:
    """Resume (deprecated v1): 409 unless paused."""
    timeout = data.timeout if data and data.timeout is not None else activator.settings.default_timeout_v1
    return _convert.sandbox(await activator.resume(owner, sandbox_id, timeout))


LIFECYCLE_ROUTES: list[HTTPRouteHandler] = [create, kill, set_timeout, refresh, pause, connect, resume]
