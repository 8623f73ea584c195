"""The sandbox actions of the UI: pause, resume, kill and extend the timeout, as the signed-in key.

Each one is a POST from the UI's own pages with the session's CSRF token (`action_session`), and goes through
the same activator call as the E2B API, so its rules (ownership, allowed transitions, TTL bounds) hold here too:
pausing a paused sandbox is a 409, an unknown id a 404, an out-of-range timeout a 400.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import post
from litestar.params import JSONBody

from gateway.ui._auth import SessionDep
from gateway.ui._context import SandboxIdPath, UiDep

__all__ = ["ACTION_ROUTES"]


class TimeoutForm(msgspec.Struct):
    seconds: int


@post("/api/sandboxes/{sandbox_id:str}/pause", status_code=200)
async def pause(ui: UiDep, action_session: SessionDep, sandbox_id: SandboxIdPath) -> dict[str, Any]:
    """E2B's pause: the sandbox is snapshotted and its TTL stops until it is resumed."""
    await ui.services.activator.pause(action_session.owner, sandbox_id)
    return {"ok": True}


@post("/api/sandboxes/{sandbox_id:str}/resume", status_code=200)
async def resume(ui: UiDep, action_session: SessionDep, sandbox_id: SandboxIdPath) -> dict[str, Any]:
    """E2B's connect: the sandbox runs again with what was left of its TTL (at least the default timeout)."""
    activator = ui.services.activator
    record = activator.get(action_session.owner, sandbox_id)
    seconds = min(max(record.remaining, activator.settings.default_timeout), activator.settings.max_timeout)
    await activator.connect(action_session.owner, sandbox_id, seconds)
    return {"ok": True}


@post("/api/sandboxes/{sandbox_id:str}/kill", status_code=200)
async def kill(ui: UiDep, action_session: SessionDep, sandbox_id: SandboxIdPath) -> dict[str, Any]:
    await ui.services.activator.kill(action_session.owner, sandbox_id)
    return {"ok": True}


@post("/api/sandboxes/{sandbox_id:str}/timeout", status_code=200)
async def extend(
    ui: UiDep, action_session: SessionDep, sandbox_id: SandboxIdPath, data: JSONBody[TimeoutForm]
) -> dict[str, Any]:
    """E2B's refresh: keep the sandbox alive for at least `seconds` more."""
    await ui.services.activator.refresh(action_session.owner, sandbox_id, data.seconds)
    return {"ok": True}


ACTION_ROUTES = [pause, resume, kill, extend]
