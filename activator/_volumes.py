"""Volumes as the activator uses them: the store (`pool`'s `LocalVolumes` on this machine) and the checks of a
create's `volumeMounts` (E2B's: each name a volume of the key, each path absolute, clean and unique)."""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from activator._errors import InvalidRequest, VolumeRefused
from pool import MAX_VOLUME_MOUNTS, Ownership, VolumeError, VolumeMount, VolumeRecord

__all__ = ["VolumeStore", "VolumeUpload", "check_mount_paths", "resolve_mounts", "volume_call"]

_T = TypeVar("_T")

# What a volume may not cover, nor be mounted above: the sandbox's kernel filesystems, and what its pid 1
# (`/usr/bin/python3 /opt/agent-sandbox/run-executor.py`) and its shells need.
_RESERVED = (
    "/proc", "/sys", "/dev", "/opt/agent-sandbox", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr/bin", "/usr/sbin",
    "/usr/lib", "/usr/lib64",
)  # fmt: skip


class VolumeStore(Protocol):
    """The volumes of every key (`pool.LocalVolumes`); blocking calls, run in a worker thread."""

    def create(self, owner: str, name: str) -> VolumeRecord: ...

    def owned(self, owner: str) -> list[VolumeRecord]: ...

    def get(self, owner: str, volume_id: str) -> VolumeRecord: ...

    def by_token(self, volume_id: str, token: str) -> VolumeRecord | None: ...

    def destroy(self, owner: str, volume_id: str) -> None: ...

    def entry(self, volume_id: str, path: str) -> dict[str, object]: ...

    def listing(self, volume_id: str, path: str, depth: int) -> list[dict[str, object]]: ...

    def make_dir(self, volume_id: str, path: str, ids: Ownership, *, force: bool) -> dict[str, object]: ...

    def open_for_read(self, volume_id: str, path: str) -> tuple[int, int]: ...

    def upload(self, volume_id: str, path: str, ids: Ownership) -> VolumeUpload: ...

    def update(self, volume_id: str, path: str, ids: Ownership) -> dict[str, object]: ...

    def remove(self, volume_id: str, path: str) -> None: ...


class VolumeUpload(Protocol):
    """A file being written (`pool`'s `Upload`): chunks, then `finish` puts it in place, or `abandon` drops it."""

    def write(self, chunk: bytes) -> None: ...

    def finish(self) -> dict[str, object]: ...

    def abandon(self) -> None: ...


def check_mount_paths(mounts: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The mounts if every path is absolute, clean (as `normpath` leaves it), unique, not inside another and not
    reserved; otherwise one 400 that lists every bad mount."""
    mounts = tuple(mounts)
    if len(mounts) > MAX_VOLUME_MOUNTS:
        raise InvalidRequest(f"volumeMounts: at most {MAX_VOLUME_MOUNTS} volumes per sandbox")
    bad: list[str] = []
    paths = [path for _, path in mounts]
    for name, path in mounts:
        if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
            bad.append(f"{name} at {path!r}: the path must be absolute and clean (no '.', '..', '//' or trailing '/')")
        elif any(path == r or path.startswith(r + "/") or r.startswith(path + "/") for r in _RESERVED):
            bad.append(f"{name} at {path!r}: {', '.join(_RESERVED)} (and what holds them) are the sandbox's own")
        elif paths.count(path) > 1:
            bad.append(f"{name} at {path!r}: another volume is mounted there")
        elif any(other != path and path.startswith(other + "/") for other in paths):
            bad.append(f"{name} at {path!r}: inside another volume's mount")
    if bad:
        raise InvalidRequest("invalid volumeMounts: " + "; ".join(bad))
    return mounts


def resolve_mounts(store: VolumeStore, owner: str, mounts: tuple[tuple[str, str], ...]) -> tuple[VolumeMount, ...]:
    """The key's volumes the mounts name; a 400 listing the names it has none of."""
    volumes = {record.name: record for record in store.owned(owner)}
    missing = sorted({name for name, _ in mounts if name not in volumes})
    if missing:
        raise InvalidRequest(f"invalid volumeMounts: no volume named {', '.join(missing)} (Volume.create makes one)")
    return tuple(VolumeMount(volume_id=volumes[name].volume_id, name=name, path=path) for name, path in mounts)


async def volume_call(call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """A blocking volume store call in a worker thread, its refusals as the control plane's errors."""
    try:
        return await asyncio.to_thread(call, *args, **kwargs)
    except VolumeError as exc:
        raise VolumeRefused(exc.status, exc.message) from exc
