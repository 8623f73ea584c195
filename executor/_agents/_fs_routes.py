"""`/v1/fs/*`: sandbox-agent's file API, with envd's path rules and ownership (coding-agents.md §2.1).

    GET    /v1/fs/entries?path          [{name, path, entryType, size, modified}] (default: the home directory)
    GET    /v1/fs/file?path             the bytes (application/octet-stream); missing → 400 as upstream
    PUT    /v1/fs/file?path             raw body → {path, bytesWritten}; parents are created
    DELETE /v1/fs/entry?path&recursive  {path}
    POST   /v1/fs/mkdir?path            {path} (parents too)
    POST   /v1/fs/move                  {from, to, overwrite?} → {from, to}
    GET    /v1/fs/stat?path             {path, entryType, size, modified}
    POST   /v1/fs/upload-batch?path     a tar (application/x-tar) unpacked under path → {paths, truncated}

Paths resolve as envd's do (relative to the default user's home). Every operation runs with the rights
of the default user, whom the agents and processes of this API run as (`_as_user`, as envd's file
routes do), so a client of the API may touch exactly what its agent may: what that user may not is a
403 `permission_denied` problem, and what it creates is its own. The executor only copies the bytes,
through the descriptor that user's own open() gave. Bodies are limited (`MAX_FILE_BYTES`,
`MAX_BATCH_BYTES`); blocking work runs in a thread.
"""

from __future__ import annotations

import asyncio
import os
import tarfile
import tempfile
from datetime import UTC, datetime
from typing import IO

import msgspec

from executor import _fs_ops
from executor._agents._http import ApiError, read_json, send_json
from executor._as_user import AsUser
from executor._defaults import Defaults
from executor._errors import PayloadTooLarge, os_errors
from executor._exchange import Request, Response
from executor._paths import ensure_dirs, resolve
from executor._users import User, lookup

__all__ = ("MAX_BATCH_BYTES", "MAX_FILE_BYTES", "FsRoutes")

MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_BATCH_BYTES = 1024 * 1024 * 1024
MAX_BATCH_PATHS = 1000
"""`upload-batch` lists at most this many paths (`truncated` says when there were more)."""


class FsEntry(msgspec.Struct, rename="camel"):
    name: str
    path: str
    entry_type: str
    size: int
    modified: str | None


class FsStat(msgspec.Struct, rename="camel"):
    path: str
    entry_type: str
    size: int
    modified: str | None


class FsMoveRequest(msgspec.Struct, forbid_unknown_fields=True):
    to: str
    overwrite: bool | None = None
    from_: str = msgspec.field(name="from", default="")


class FsRoutes:
    def __init__(self, defaults: Defaults, as_user: AsUser) -> None:
        self._defaults = defaults
        self._as_user = as_user

    def _path(self, request: Request, name: str = "path", required: bool = True) -> tuple[str, User]:
        user = lookup(self._defaults.user)
        if required and name not in request.query:
            raise ApiError("invalid_request", 400, f"missing required query parameter '{name}'")
        return resolve(request.query.get(name, ""), user, None), user

    async def entries(self, request: Request, response: Response) -> None:
        path, user = self._path(request, required=False)
        found = await self._as_user.run(user, _fs_ops.agent_entries, path)
        entries = [FsEntry(os.path.basename(entry.path), entry.path, *_described(entry)) for entry in found]
        await send_json(response, 200, entries)

    async def read(self, request: Request, response: Response) -> None:
        path, user = self._path(request)
        opened = await self._as_user.run(user, _fs_ops.agent_open_to_read, path)
        data = await asyncio.to_thread(_read_bytes, opened.fd, path)
        await response.send(200, data, "application/octet-stream")

    async def write(self, request: Request, response: Response) -> None:
        path, user = self._path(request)
        try:
            data = await request.body.read(MAX_FILE_BYTES)
        except PayloadTooLarge as exc:
            raise ApiError("payload_too_large", 413, exc.message) from exc
        await self._write(user, path, data, None)
        await send_json(response, 200, {"path": path, "bytesWritten": len(data)})

    async def delete(self, request: Request, response: Response) -> None:
        path, user = self._path(request)
        recursive = request.query.get("recursive", "").lower() in ("1", "true")
        await self._as_user.run(user, _fs_ops.agent_remove, path, recursive)
        await send_json(response, 200, {"path": path})

    async def mkdir(self, request: Request, response: Response) -> None:
        path, user = self._path(request)
        await self._as_user.run(user, ensure_dirs, path, user.uid, user.gid)
        await send_json(response, 200, {"path": path})

    async def move(self, request: Request, response: Response) -> None:
        body = await read_json(request, FsMoveRequest)
        user = lookup(self._defaults.user)
        source, target = resolve(body.from_, user, None), resolve(body.to, user, None)
        if not body.from_:
            raise ApiError("invalid_request", 400, "missing required field 'from'")
        await self._as_user.run(user, _fs_ops.agent_move, source, target, bool(body.overwrite), user.uid, user.gid)
        await send_json(response, 200, {"from": source, "to": target})

    async def stat(self, request: Request, response: Response) -> None:
        path, user = self._path(request)
        status = await self._as_user.run(user, _fs_ops.agent_stat, path)
        await send_json(response, 200, FsStat(status.path, *_described(status)))

    async def upload_batch(self, request: Request, response: Response) -> None:
        root, user = self._path(request, required=False)
        with tempfile.TemporaryFile() as spool:
            size = 0
            async for chunk in request.body.chunks():
                size += len(chunk)
                if size > MAX_BATCH_BYTES:
                    raise ApiError("payload_too_large", 413, f"the tar is larger than {MAX_BATCH_BYTES} bytes")
                spool.write(chunk)
            spool.seek(0)
            paths = await self._unpack(spool, root, user)
        await send_json(response, 200, {"paths": paths[:MAX_BATCH_PATHS], "truncated": len(paths) > MAX_BATCH_PATHS})

    async def _write(self, user: User, path: str, data: bytes, mode: int | None) -> None:
        opened = await self._as_user.run(user, _fs_ops.agent_open_to_write, path, user.uid, user.gid, mode)
        await asyncio.to_thread(_write_bytes, opened.fd, path, data)

    async def _unpack(self, spool: IO[bytes], root: str, user: User) -> list[str]:
        """Regular files and directories of a tar under `root`, owned by `user`; anything else is refused whole."""
        try:
            with await asyncio.to_thread(tarfile.open, fileobj=spool, mode="r:") as archive:
                members = await asyncio.to_thread(_members, archive, root)
                written = []
                for member, target in members:
                    if member.isdir():
                        await self._as_user.run(user, ensure_dirs, target, user.uid, user.gid)
                        continue
                    data = await asyncio.to_thread(_member_bytes, archive, member)
                    await self._write(user, target, data, member.mode & 0o777)
                    written.append(target)
                return written
        except tarfile.TarError as exc:
            raise ApiError("invalid_request", 400, f"the body is not a tar archive: {exc}") from exc


def _described(status: _fs_ops.Status) -> tuple[str, int, str]:
    """An entry's entryType, size and modified."""
    modified = datetime.fromtimestamp(status.modified, UTC).isoformat().replace("+00:00", "Z")
    return "directory" if status.directory else "file", status.size, modified


def _read_bytes(fd: int, path: str) -> bytes:
    with os_errors(f"error reading '{path}'"), os.fdopen(fd, "rb") as file:
        if os.fstat(file.fileno()).st_size > MAX_FILE_BYTES:
            raise ApiError("payload_too_large", 413, f"{path} is larger than {MAX_FILE_BYTES} bytes: use envd's /files")
        return file.read()


def _write_bytes(fd: int, path: str, data: bytes) -> None:
    with os_errors(f"error writing '{path}'"), os.fdopen(fd, "wb") as file:
        file.write(data)


def _members(archive: tarfile.TarFile, root: str) -> list[tuple[tarfile.TarInfo, str]]:
    """Each member of the tar and where it goes, once every one has been checked."""
    members = archive.getmembers()
    for member in members:
        name = os.path.normpath(member.name)
        if (
            os.path.isabs(member.name)
            or name == ".."
            or name.startswith("../")
            or not (member.isfile() or member.isdir())
        ):
            raise ApiError(
                "invalid_request", 400, f"refused tar member {member.name!r}: only relative files and directories"
            )
    return [(member, os.path.join(root, os.path.normpath(member.name))) for member in members]


def _member_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    source = archive.extractfile(member)
    assert source is not None  # a regular file
    return source.read()
