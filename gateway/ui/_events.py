"""The live pages' event streams (Server-Sent Events): a fresh snapshot every `refresh` seconds when it changed.

Each stream re-reads the activator on every tick, so it shows what the E2B API would answer at that moment; it
reads records and cgroup figures only, so watching a page never wakes a paused sandbox nor counts as its traffic.
A stream re-checks its session on every tick and ends with a `signed-out` event once the session is gone (sign
out in another tab, expiry, revoked key); the detail stream ends with `gone` once the sandbox is killed. The
per-stream state (the last snapshot sent) lives in the generator, never on a shared object.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import msgspec
from litestar import Request, get
from litestar.params import FromQuery, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from activator import SandboxNotFound
from gateway.ui._auth import COOKIE, SessionDep, live_session
from gateway.ui._context import SandboxIdPath, UiContext, UiDep
from gateway.ui._pages import STATE_FILTERS, parse_metadata
from gateway.ui._views import list_sandboxes, one_sandbox, pool_views

__all__ = ["EVENT_ROUTES"]

_KEEPALIVE_TICKS = 15  # a comment line this often when nothing changed, so proxies keep the stream open
_LOG_LINES = 200  # lifecycle lines the detail page shows

Snapshot = Callable[[str], Awaitable[dict[str, Any] | None]]  # owner -> the page's data, or None: stop
_encode = msgspec.json.Encoder().encode


class _Gone(Exception):
    """The detail page's sandbox no longer exists."""


@get("/api/sandboxes/events")
async def sandboxes_events(
    request: Request[Any, Any, Any],
    ui: UiDep,
    session: SessionDep,
    wanted_state: Annotated[str, QueryParameter(name="state")] = "",
    metadata: FromQuery[str] = "",
) -> ServerSentEvent:
    """Snapshots of the Sandboxes page: `{now, sandboxes: [...]}`."""
    states = {wanted_state} if wanted_state in STATE_FILTERS else set()
    wanted = parse_metadata(metadata)

    async def snapshot(owner: str) -> dict[str, Any]:
        views = await list_sandboxes(ui.services, owner, states=states, metadata=wanted)
        return {"sandboxes": views}

    return _stream(ui, request.cookies.get(COOKIE), snapshot)


@get("/api/sandboxes/{sandbox_id:str}/events")
async def sandbox_events(
    request: Request[Any, Any, Any], ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath
) -> ServerSentEvent:
    """Snapshots of one sandbox's page: `{now, sandbox, logs}`; a `gone` event once it is killed."""
    ui.services.activator.get(session.owner, sandbox_id)  # 404 at once for an unknown id

    async def snapshot(owner: str) -> dict[str, Any] | None:
        try:
            view = await one_sandbox(ui.services, owner, sandbox_id)
            logs = ui.services.activator.logs(owner, sandbox_id)[-_LOG_LINES:]
        except SandboxNotFound:
            return None
        return {"sandbox": view, "logs": [[line.timestamp, line.level, line.message] for line in logs]}

    return _stream(ui, request.cookies.get(COOKIE), snapshot, ended="gone")


@get("/api/pools/events")
async def pools_events(request: Request[Any, Any, Any], ui: UiDep, session: SessionDep) -> ServerSentEvent:
    """Snapshots of the Pools page: `{now, pools: [...] | null}` (null: the server runs no warm pools)."""

    async def snapshot(owner: str) -> dict[str, Any]:
        return {"pools": pool_views(ui.services)}

    return _stream(ui, request.cookies.get(COOKIE), snapshot)


def _stream(ui: UiContext, token: str | None, snapshot: Snapshot, *, ended: str = "") -> ServerSentEvent:
    return ServerSentEvent(_events(ui, token, snapshot, ended), retry_duration=2000)


async def _events(ui: UiContext, token: str | None, snapshot: Snapshot, ended: str) -> AsyncIterator[Any]:
    last, quiet = b"", 0
    while True:
        session = await live_session(ui, token)
        if session is None:
            yield ServerSentEventMessage(event="signed-out", data="{}")
            return
        data = await snapshot(session.owner)
        if data is None:
            yield ServerSentEventMessage(event=ended, data="{}")
            return
        payload = _encode(data)
        if payload != last:
            last, quiet = payload, 0
            body = _encode({"now": time.time(), **data}).decode()
            yield ServerSentEventMessage(event="snapshot", data=body)
        else:
            quiet += 1
            if quiet >= _KEEPALIVE_TICKS:
                quiet = 0
                yield ServerSentEventMessage(comment="keep-alive")
        await asyncio.sleep(ui.refresh)


EVENT_ROUTES = [sandboxes_events, sandbox_events, pools_events]
