"""`/v1/fs/*`: sandbox-agent's file API, with envd's path rules and ownership (coding-agents.md §2.1).

    GET    /v1/fs/entries?path          [{name, path, entryType, size, modified}] (default: the home directory)
    GET    /v1/fs/file?path             the bytes (application/octet-stream); missing → 400 as upstream
    PUT    /v1/fs/file?path             raw body → {path, bytesWritten}; parents are created
    DELETE /v1/fs/entry?path&recursive  {path}
    POST   /v1/fs/mkdir?path            {path} (parents too)
    POST   /v1/fs/move                  {from, to, overwrite?} → {from, to}
    GET    /v1/fs/stat?path             {path, entryType, size, modified}
    POST   /v1/fs/upload-batch?path     a tar (application/x-tar) unpacked under path → {paths, truncated}

Paths resolve as envd's do (relative to the default user's home); what is created belongs to that
user. Bodies are limited (`MAX_FILE_BYTES`, `MAX_BATCH_BYTES`); blocking work runs in a thread.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tarfile
import tempfile
from datetime import UTC, datetime
from typing import IO

import msgspec

from executor._agents._http import ApiError, read_json, send_json
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
    def __init__(self, defaults: Defaults) -> None:
        self._defaults = defaults

    def _path(self, request: Request, name: str = "path", required: bool = True) -> tuple[str, User]:
        user = lookup(self._defaults.user)
        if required and name not in request.query:
            raise ApiError("invalid_request", 400, f"missing required query parameter '{name}'")
        return resolve(request.query.get(name, ""), user, None), user

    async def entries(self, request: Request, response: Response) -> None:
        path, _ = self._path(request, required=False)
        await send_json(response, 200, await asyncio.to_thread(_list, path))

    async def read(self, request: Request, response: Response) -> None:
        path, _ = self._path(request)
        data = await asyncio.to_thread(_read_bytes, path)
        await response.send(200, data, "application/octet-stream")

    async def write(self, request: Request, response: Response) -> None:
        path, user = self._path(request)
        try:
            data = await request.body.read(MAX_FILE_BYTES)
        except PayloadTooLarge as exc:
            raise ApiError("payload_too_large", 413, exc.message) from exc
        await asyncio.to_thread(_write_bytes, path, data, user)
        await send_json(response, 200, {"path": path, "bytesWritten": len(data)})

    async def delete(self, request: Request, response: Response) -> None:
        path, _ = self._path(request)
        recursive = request.query.get("recursive", "").lower() in ("1", "true")
        await asyncio.to_thread(_remove, path, recursive)
        await send_json(response, 200, {"path": path})

    async def mkdir(self, request: Request, response: Response) -> None:
        path, user = self._path(request)
        await asyncio.to_thread(ensure_dirs, path, user.uid, user.gid)
        await send_json(response, 200, {"path": path})

    async def move(self, request: Request, response: Response) -> None:
        body = await read_json(request, FsMoveRequest)
        user = lookup(self._defaults.user)
        source, target = resolve(body.from_, user, None), resolve(body.to, user, None)
        if not body.from_:
            raise ApiError("invalid_request", 400, "missing required field 'from'")
        await asyncio.to_thread(_move, source, target, bool(body.overwrite), user)
        await send_json(response, 200, {"from": source, "to": target})

    async def stat(self, request: Request, response: Response) -> None:
        path, _ = self._path(request)
        await send_json(response, 200, await asyncio.to_thread(_stat, path))

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
            paths = await asyncio.to_thread(_unpack, spool, root, user)
        await send_json(response, 200, {"paths": paths[:MAX_BATCH_PATHS], "truncated": len(paths) > MAX_BATCH_PATHS})


def _list(path: str) -> list[FsEntry]:
    if not os.path.isdir(path):
        raise ApiError("invalid_request", 400, f"path not found or not a directory: {path}")
    entries = []
    with os_errors(f"error listing '{path}'"), os.scandir(path) as iterator:
        for child in sorted(iterator, key=lambda entry: entry.name):
            info = child.stat(follow_symlinks=True) if os.path.exists(child.path) else child.stat(follow_symlinks=False)
            entries.append(FsEntry(child.name, child.path, _kind(info), info.st_size, _modified(info)))
    return entries


def _kind(info: os.stat_result) -> str:
    return "directory" if stat.S_ISDIR(info.st_mode) else "file"


def _modified(info: os.stat_result) -> str:
    return datetime.fromtimestamp(info.st_mtime, UTC).isoformat().replace("+00:00", "Z")


def _read_bytes(path: str) -> bytes:
    if not os.path.isfile(path):
        raise ApiError("invalid_request", 400, f"path not found: {path}")
    with os_errors(f"error reading '{path}'"), open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size > MAX_FILE_BYTES:
            raise ApiError("payload_too_large", 413, f"{path} is larger than {MAX_FILE_BYTES} bytes: use envd's /files")
        return file.read()


def _remove(path: str, recursive: bool) -> None:
    if not os.path.lexists(path):
        raise ApiError("invalid_request", 400, f"path not found: {path}")
    directory = os.path.isdir(path) and not os.path.islink(path)
    if directory and not recursive and os.listdir(path):
        raise ApiError("invalid_request", 400, f"directory is not empty (use recursive=true): {path}")
    with os_errors(f"error removing '{path}'"):
        if directory:
            shutil.rmtree(path)
        else:
            os.remove(path)


def _move(source: str, target: str, overwrite: bool, user: User) -> None:
    if not os.path.lexists(source):
        raise ApiError("invalid_request", 400, f"path not found: {source}")
    if os.path.lexists(target) and not overwrite:
        raise ApiError("conflict", 409, f"destination exists (use overwrite=true): {target}")
    if os.path.isdir(source) and not os.path.islink(source) and _within(target, source):
        raise ApiError("invalid_request", 400, f"cannot move '{source}' into itself: {target}")
    ensure_dirs(os.path.dirname(target), user.uid, user.gid)
    with os_errors(f"error moving '{source}' to '{target}'"):
        os.replace(source, target)


def _within(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or would be inside it (its existing parents resolved)."""
    real, parent = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([real, parent]) == parent


def _stat(path: str) -> FsStat:
    if not os.path.lexists(path):
        raise ApiError("invalid_request", 400, f"path not found: {path}")
    with os_errors(f"error reading the status of '{path}'"):
        info = os.stat(path) if os.path.exists(path) else os.lstat(path)
    return FsStat(path, _kind(info), info.st_size, _modified(info))


def _write_bytes(path: str, data: bytes, user: User) -> None:
    ensure_dirs(os.path.dirname(path), user.uid, user.gid)
    if os.path.isdir(path):
        raise ApiError("invalid_request", 400, f"path is a directory: {path}")
    with os_errors(f"error writing '{path}'"):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        with os.fdopen(descriptor, "wb") as file:
            os.fchown(descriptor, user.uid, user.gid)
            file.write(data)


def _unpack(spool: IO[bytes], root: str, user: User) -> list[str]:
    """Regular files and directories of a tar under `root`, owned by `user`; anything else is refused whole."""
    try:
        with tarfile.open(fileobj=spool, mode="r:") as archive:
            return _extract(archive, root, user)
    except tarfile.TarError as exc:
        raise ApiError("invalid_request", 400, f"the body is not a tar archive: {exc}") from exc


def _extract(archive: tarfile.TarFile, root: str, user: User) -> list[str]:
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
    written = []
    for member in members:
        target = os.path.join(root, os.path.normpath(member.name))
        if member.isdir():
            ensure_dirs(target, user.uid, user.gid)
            continue
        source = archive.extractfile(member)
        assert source is not None  # a regular file
        _write_bytes(target, source.read(), user)
        os.chmod(target, member.mode & 0o777)
        written.append(target)
    return written
