"""The `filesystem.Filesystem` Connect service, except watching (`_watch_service`).

Paths are resolved for the calling user (`_paths.resolve`); the operations themselves run with the
executor's own rights, as in envd, and whatever they create is owned by the calling user.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from executor._connect import Call, Rpc, Unary
from executor._defaults import Defaults
from executor._entries import FILE_TYPE_DIRECTORY, entry_from_stat, entry_info
from executor._errors import AlreadyExists, InvalidArgument, NotFound, os_errors
from executor._paths import ensure_dirs, resolve
from executor._users import User, from_authorization
from executor.envd import (
    Empty,
    EntryInfo,
    EntryResponse,
    ListDirRequest,
    ListDirResponse,
    MoveRequest,
    PathRequest,
)

__all__ = ("FilesystemService",)


class FilesystemService:
    """Stat, MakeDir, Move, ListDir and Remove."""

    def __init__(self, defaults: Defaults) -> None:
        self._defaults = defaults

    def methods(self) -> dict[str, Rpc]:
        return {
            "Stat": Unary(PathRequest, self.stat),
            "MakeDir": Unary(PathRequest, self.make_dir),
            "Move": Unary(MoveRequest, self.move),
            "ListDir": Unary(ListDirRequest, self.list_dir),
            "Remove": Unary(PathRequest, self.remove),
        }

    def stat(self, request: PathRequest, call: Call) -> EntryResponse:
        return EntryResponse(entry_info(self._path(request.path, call)[0]))

    def make_dir(self, request: PathRequest, call: Call) -> EntryResponse:
        path, user = self._path(request.path, call)
        if os.path.isdir(path):
            raise AlreadyExists(f"directory already exists: {path}")
        if os.path.lexists(path):
            raise InvalidArgument(f"path already exists but it is not a directory: {path}")
        ensure_dirs(path, user.uid, user.gid)
        return EntryResponse(entry_info(path))

    def move(self, request: MoveRequest, call: Call) -> EntryResponse:
        source, user = self._path(request.source, call)
        destination, _ = self._path(request.destination, call)
        if not os.path.lexists(source):
            raise NotFound(f"source file not found: {source}")
        ensure_dirs(os.path.dirname(destination), user.uid, user.gid)
        with os_errors(f"error moving '{source}' to '{destination}'"):
            os.rename(source, destination)
        return EntryResponse(entry_info(destination))

    def list_dir(self, request: ListDirRequest, call: Call) -> ListDirResponse:
        path, _ = self._path(request.path, call)
        with os_errors(f"error listing '{path}'"):
            real = os.path.realpath(path, strict=True)
        if not os.path.isdir(real):
            raise InvalidArgument(f"path is not a directory: {path}")
        entries: list[EntryInfo] = []
        with os_errors(f"error reading directory '{path}'"):
            _walk(path, real, max(request.depth, 1), entries)
        return ListDirResponse(entries)

    def remove(self, request: PathRequest, call: Call) -> Empty:
        """Like envd's `os.RemoveAll`: a whole tree, a link (not what it points to), and nothing to remove is fine."""
        path, _ = self._path(request.path, call)
        with os_errors(f"error removing file or directory '{path}'"), contextlib.suppress(FileNotFoundError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        return Empty()

    def _path(self, path: str, call: Call) -> tuple[str, User]:
        user = from_authorization(call.headers.get("authorization"), self._defaults.user)
        return resolve(path, user, self._defaults.workdir), user


def _walk(shown: str, real: str, depth: int, entries: list[EntryInfo]) -> None:
    """Depth-first, in name order, not following symlinks; entries are named under `shown`."""
    with os.scandir(real) as iterator:
        children = sorted(iterator, key=lambda child: child.name)
    for child in children:
        entry = entry_from_stat(os.path.join(shown, child.name), child.stat(follow_symlinks=False))
        entries.append(entry)
        if depth > 1 and entry.type == FILE_TYPE_DIRECTORY and not entry.is_symlink:
            _walk(entry.path, child.path, depth - 1, entries)
