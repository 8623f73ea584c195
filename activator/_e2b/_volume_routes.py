"""E2B's Volume API (e2b-features.md §4.1): volumes under the key (`/volumes`), and their content API
(`/volumecontent/{volumeID}/{path,dir,file}`), which the SDK calls at `E2B_VOLUME_API_URL` with the volume's
own token as `Authorization: Bearer` and no API key. Paths are the volume's (`/` is its root).
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

from litestar import Request, Response, delete, get, patch, post, put
from litestar.background_tasks import BackgroundTask
from litestar.handlers import HTTPRouteHandler
from litestar.params import JSONBody, PathParameter, QueryParameter
from litestar.response import Stream

from activator._e2b import _wire
from activator._e2b._openapi import errors, keyed_errors
from activator._e2b._state import ActivatorDep, OwnerDep
from activator._volumes import VolumeStore, volume_call
from pool import VOLUME_SIZE_MB, Ownership, VolumeRecord

__all__ = ["PUBLIC_VOLUME_ROUTES", "VOLUME_ROUTES"]

_VolumeId = Annotated[str, PathParameter(max_length=64, pattern="^[a-z0-9]+$")]
_Path = Annotated[str, QueryParameter(min_length=1, max_length=4096)]
_Id = Annotated[int | None, QueryParameter(ge=0, le=65535)]
_Mode = Annotated[int | None, QueryParameter(ge=0, le=0o7777)]
_Depth = Annotated[int, QueryParameter(ge=1, le=32)]
_Force = Annotated[bool, QueryParameter()]
_CONTENT = "/volumecontent/{volume_id:str}"
_CHUNK = 1 << 20


def _with_token(record: VolumeRecord) -> _wire.VolumeAndToken:
    return _wire.VolumeAndToken(volume_id=record.volume_id, name=record.name, token=record.token)


@post("/volumes", status_code=201, responses=keyed_errors(400, 409, 501))
async def create_volume(
    data: JSONBody[_wire.NewVolume], activator: ActivatorDep, owner: OwnerDep
) -> _wire.VolumeAndToken:
    """A new, empty volume of the key's (a name it has no volume of), and the token of its content API."""
    return _with_token(await activator.create_volume(owner, data.name))


@get("/volumes", responses=keyed_errors(501))
async def list_volumes(activator: ActivatorDep, owner: OwnerDep) -> list[_wire.VolumeOut]:
    """The key's volumes, oldest first."""
    return [_wire.VolumeOut(volume_id=r.volume_id, name=r.name) for r in await activator.volumes(owner)]


@get("/volumes/{volume_id:str}", responses=keyed_errors(400, 404, 501))
async def get_volume(volume_id: _VolumeId, activator: ActivatorDep, owner: OwnerDep) -> _wire.VolumeAndToken:
    """One of the key's volumes, with its token (what `Volume.connect` needs)."""
    return _with_token(await activator.volume(owner, volume_id))


@delete("/volumes/{volume_id:str}", status_code=204, responses=keyed_errors(400, 404, 409, 501))
async def destroy_volume(volume_id: _VolumeId, activator: ActivatorDep, owner: OwnerDep) -> None:
    """Remove the volume and its files; 409 while a sandbox mounts it."""
    await activator.destroy_volume(owner, volume_id)


async def _store(request: Request[Any, Any, Any], activator: ActivatorDep, volume_id: str) -> VolumeStore:
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    return await activator.volume_files(volume_id, token.strip() if scheme.lower() == "bearer" else "")


_CONTENT_ERRORS = errors(400, 401, 404, 501)


@get(f"{_CONTENT}/path", responses=_CONTENT_ERRORS)
async def content_entry(
    request: Request[Any, Any, Any], volume_id: _VolumeId, path: _Path, activator: ActivatorDep
) -> dict[str, object]:
    """The entry at `path` (a symlink as itself, with its `target`)."""
    return await volume_call((await _store(request, activator, volume_id)).entry, volume_id, path)


@patch(f"{_CONTENT}/path", responses=_CONTENT_ERRORS)
async def content_update(
    request: Request[Any, Any, Any], volume_id: _VolumeId, path: _Path, data: JSONBody[_wire.VolumeMetadata],
    activator: ActivatorDep,
) -> dict[str, object]:  # fmt: skip
    """Change the owner or mode of the entry at `path`."""
    store = await _store(request, activator, volume_id)
    return await volume_call(store.update, volume_id, path, (data.uid, data.gid, data.mode))


@delete(f"{_CONTENT}/path", status_code=204, responses=_CONTENT_ERRORS)
async def content_remove(
    request: Request[Any, Any, Any], volume_id: _VolumeId, path: _Path, activator: ActivatorDep
) -> None:
    """Remove the file, symlink or directory (with what is in it) at `path`."""
    await volume_call((await _store(request, activator, volume_id)).remove, volume_id, path)


@get(f"{_CONTENT}/dir", responses=_CONTENT_ERRORS)
async def content_list(
    request: Request[Any, Any, Any], volume_id: _VolumeId, path: _Path, activator: ActivatorDep, depth: _Depth = 1
) -> list[dict[str, object]]:
    """The entries of the directory at `path`, down to `depth` levels (at most 10,000)."""
    return await volume_call((await _store(request, activator, volume_id)).listing, volume_id, path, depth)


@post(f"{_CONTENT}/dir", status_code=201, responses=errors(400, 401, 404, 409, 501, 507))
async def content_make_dir(
    request: Request[Any, Any, Any], volume_id: _VolumeId, path: _Path, activator: ActivatorDep,
    uid: _Id = None, gid: _Id = None, mode: _Mode = None, force: _Force = False,
) -> dict[str, object]:  # fmt: skip
    """Make the directory at `path` (`force`: with its missing parents, and no error if it exists, which keeps its
    owner and mode)."""
    store = await _store(request, activator, volume_id)
    ids: Ownership = (uid, gid, mode)
    return await volume_call(store.make_dir, volume_id, path, ids, force=force)


class _FileChunks:
    """The bytes of an open file, at most the size it had when opened (a sandbox may append meanwhile), read in a
    worker thread; the descriptor is closed at the end, on an error, or by the response's background task when
    the stream never started (a client gone first)."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd, self._left = fd, size

    def __aiter__(self) -> _FileChunks:
        return self

    async def __anext__(self) -> bytes:
        chunk = await asyncio.to_thread(os.read, self._fd, min(_CHUNK, self._left)) if self._left > 0 else b""
        if not chunk:
            self.close()
            raise StopAsyncIteration
        self._left -= len(chunk)
        return chunk

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@get(f"{_CONTENT}/file", responses=_CONTENT_ERRORS, media_type="application/octet-stream")
async def content_read(
    request: Request[Any, Any, Any], volume_id: _VolumeId, path: _Path, activator: ActivatorDep
) -> Stream:
    """The bytes of the file at `path`, streamed (as many as it had when the read began)."""
    fd, size = await volume_call((await _store(request, activator, volume_id)).open_for_read, volume_id, path)
    chunks = _FileChunks(fd, size)
    headers = {"Content-Length": str(size)}
    return Stream(
        chunks, media_type="application/octet-stream", headers=headers, background=BackgroundTask(chunks.close)
    )


@put(
    f"{_CONTENT}/file", status_code=201, responses=errors(400, 401, 404, 413, 501, 507),
    request_max_body_size=VOLUME_SIZE_MB << 20,
)  # fmt: skip
async def content_write(
    request: Request[Any, Any, Any], volume_id: _VolumeId, path: _Path, activator: ActivatorDep,
    uid: _Id = None, gid: _Id = None, mode: _Mode = None, force: _Force = False,
) -> Response[dict[str, object]]:  # fmt: skip
    """Write the body to the file at `path`, which it replaces once all of it is there (with or without `force`,
    E2B's "force overwrite"); the directory must exist."""
    del force  # an existing file is replaced either way
    store = await _store(request, activator, volume_id)
    ids: Ownership = (uid, gid, mode)
    upload = await volume_call(store.upload, volume_id, path, ids)
    try:
        pending = bytearray()
        async for chunk in request.stream():
            pending += chunk
            if len(pending) >= _CHUNK:  # one thread hop per MiB, not per ASGI message
                await volume_call(upload.write, bytes(pending))
                pending.clear()
        if pending:
            await volume_call(upload.write, bytes(pending))
    except BaseException:
        upload.abandon()  # a close: cheap, and never left to a cancelled thread hop
        raise
    return Response(await volume_call(upload.finish), status_code=201)


VOLUME_ROUTES: list[HTTPRouteHandler] = [create_volume, list_volumes, get_volume, destroy_volume]
PUBLIC_VOLUME_ROUTES: list[HTTPRouteHandler] = [
    content_entry, content_update, content_remove, content_list, content_make_dir, content_read, content_write,
]  # fmt: skip
