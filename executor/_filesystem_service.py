"""The `filesystem.Filesystem` Connect service, except watching (`_watch_service`).

Paths are resolved for the calling user (`_paths.resolve`); the operations (`_fs_ops`) run with that
user's rights (`_as_user`), so what it may not do is `permission_denied`, and whatever they create is
owned by the calling user.
"""

from __future__ import annotations

from executor import _fs_ops
from executor._as_user import AsUser
from executor._connect import Call, Rpc, Unary
from executor._defaults import Defaults
from executor._paths import resolve
from executor._users import User, from_authorization
from executor.envd import (
    Empty,
    EntryResponse,
    ListDirRequest,
    ListDirResponse,
    MoveRequest,
    PathRequest,
)

__all__ = ("FilesystemService",)


class FilesystemService:
    """Stat, MakeDir, Move, ListDir and Remove."""

    def __init__(self, defaults: Defaults, as_user: AsUser) -> None:
        self._defaults = defaults
        self._as_user = as_user

    def methods(self) -> dict[str, Rpc]:
        return {
            "Stat": Unary(PathRequest, self.stat),
            "MakeDir": Unary(PathRequest, self.make_dir),
            "Move": Unary(MoveRequest, self.move),
            "ListDir": Unary(ListDirRequest, self.list_dir),
            "Remove": Unary(PathRequest, self.remove),
        }

    async def stat(self, request: PathRequest, call: Call) -> EntryResponse:
        path, user = self._path(request.path, call)
        return EntryResponse(await self._as_user.run(user, _fs_ops.stat, path))

    async def make_dir(self, request: PathRequest, call: Call) -> EntryResponse:
        path, user = self._path(request.path, call)
        return EntryResponse(await self._as_user.run(user, _fs_ops.make_dir, path, user.uid, user.gid))

    async def move(self, request: MoveRequest, call: Call) -> EntryResponse:
        source, user = self._path(request.source, call)
        destination, _ = self._path(request.destination, call)
        return EntryResponse(await self._as_user.run(user, _fs_ops.move, source, destination, user.uid, user.gid))

    async def list_dir(self, request: ListDirRequest, call: Call) -> ListDirResponse:
        path, user = self._path(request.path, call)
        return ListDirResponse(await self._as_user.run(user, _fs_ops.list_dir, path, request.depth))

    async def remove(self, request: PathRequest, call: Call) -> Empty:
        path, user = self._path(request.path, call)
        await self._as_user.run(user, _fs_ops.remove, path)
        return Empty()

    def _path(self, path: str, call: Call) -> tuple[str, User]:
        user = from_authorization(call.headers.get("authorization"), self._defaults.user)
        return resolve(path, user, self._defaults.workdir), user
