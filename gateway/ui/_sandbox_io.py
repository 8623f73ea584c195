"""What runs and what is stored inside a sandbox, read through its executor: processes, directories, downloads.

These are read on demand (the page asks when its tab is opened or refreshed), never by the live stream: they
reach into the sandbox, so they wake one the idle policy paused, like any request would. A sandbox paused by its
user is not woken from here: the answer is a 409 that says to resume it.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from litestar import Response, get
from litestar.params import FromQuery
from litestar.response import Stream

from activator import SandboxConflict, SandboxRecord
from gateway.ui._auth import SessionDep
from gateway.ui._context import SandboxIdPath, UiContext, UiDep
from gateway.ui._envd import Entry, Envd
from pool import ENVD_PORT

__all__ = ["IO_ROUTES", "envd_for", "reachable"]


def envd_for(ui: UiContext, record: SandboxRecord) -> Envd:
    """The executor of a sandbox the session may reach (`reachable`)."""
    reachable(record)
    activator = ui.services.activator
    return Envd(lambda: activator.open_upstream(record.id, ENVD_PORT), token=record.access_token)


def reachable(record: SandboxRecord) -> SandboxRecord:
    """The sandbox, unless its user keeps it paused (SandboxConflict): the page does not wake it then."""
    if record.user_paused:
        raise SandboxConflict(f"sandbox {record.id} is {record.state.value}: resume it to look inside")
    return record


@get("/api/sandboxes/{sandbox_id:str}/processes")
async def processes(ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath) -> dict[str, Any]:
    """The processes the executor started: `{processes: [{pid, cmd, args, cwd, tag}]}`."""
    envd = envd_for(ui, ui.services.activator.get(session.owner, sandbox_id))
    listed = sorted(await envd.processes(), key=lambda process: process.pid)
    rows = [
        {"pid": p.pid, "cmd": p.config.cmd, "args": p.config.args, "cwd": p.config.cwd, "tag": p.tag} for p in listed
    ]
    return {"processes": rows}


@get("/api/sandboxes/{sandbox_id:str}/files")
async def files(ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath, path: FromQuery[str] = "") -> dict[str, Any]:
    """The entries of a directory: `{path, entries: [{name, path, type, size, permissions, modified}]}`."""
    envd = envd_for(ui, ui.services.activator.get(session.owner, sandbox_id))
    entries = await envd.list_dir(path or ".")
    ordered = sorted(entries, key=lambda e: (e.type != "FILE_TYPE_DIRECTORY", e.name))
    return {"path": path, "entries": [_entry(e) for e in ordered]}


@get("/api/sandboxes/{sandbox_id:str}/download")
async def download(ui: UiDep, session: SessionDep, sandbox_id: SandboxIdPath, path: FromQuery[str]) -> Response[Any]:
    """The file at `path`, as an attachment, streamed from the executor as it reads it."""
    envd = envd_for(ui, ui.services.activator.get(session.owner, sandbox_id))
    stack = contextlib.AsyncExitStack()
    response = await stack.enter_async_context(envd.download(path))  # 404 / 502 before anything is sent

    async def body() -> AsyncIterator[bytes]:
        async with stack:
            async for chunk in response.chunks():
                yield chunk

    headers = {"Content-Disposition": _attachment(path.rstrip("/").rpartition("/")[2] or "download")}
    if "content-length" in response.headers:
        headers["Content-Length"] = response.headers["content-length"]
    return Stream(body(), media_type="application/octet-stream", headers=headers)


def _entry(e: Entry) -> dict[str, Any]:
    kind = e.type.removeprefix("FILE_TYPE_").lower()
    return {
        "name": e.name, "path": e.path, "type": kind, "size": int(e.size), "permissions": e.permissions,
        "modified": e.modified_time, "target": e.symlink_target,
    }  # fmt: skip


def _attachment(name: str) -> str:
    """`Content-Disposition` for any file name: an ASCII fallback, and the exact name per RFC 6266."""
    fallback = "".join(c if c.isascii() and c.isprintable() and c not in '"\\;' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{urllib.parse.quote(name, safe='')}"


IO_ROUTES = [processes, files, download]
