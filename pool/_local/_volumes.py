"""The local runtime's volumes: one directory per volume under `<data>/volumes`, with its record and its files.

`<id>/volume.json` is the record (`pool.VolumeRecord`); `<id>/disk` the files, on a filesystem of the
volume's own (an ext4 image of `VOLUME_SIZE_MB`, as a sandbox's writable layer is: `_disk`), so a sandbox
writing to a volume fills that volume, never the host. Files are owned by the ids the sandboxes see:
each sandbox mounts the volume id-mapped into its uid range (`_launcher`), so `user` (1000) inside owns
what uid 1000 owns here, in every sandbox at once. The volume outlives every sandbox that mounted it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import string
import threading
import time
from pathlib import Path

import msgspec

from pool._errors import VolumeError
from pool._local import _volume_files
from pool._local._disk import DiskImages
from pool._local._volume_files import DEFAULT_UID, Upload
from pool._volumes import MAX_VOLUMES_PER_OWNER, VOLUME_SIZE_MB, Ownership, VolumeRecord

__all__ = ["LocalVolumes"]

_RECORD = "volume.json"
_ID_ALPHABET = string.ascii_lowercase + string.digits


class LocalVolumes:
    """The volumes of every key on this machine. Blocking calls (a filesystem is made or mounted): callers run
    them in a worker thread; the lock keeps two creates of one name from both succeeding."""

    def __init__(self, root: Path, disks: DiskImages, *, size_mb: int = VOLUME_SIZE_MB) -> None:
        self._root = root
        self._disks = disks
        self._size_mb = size_mb
        self._lock = threading.Lock()
        for leftover in self._root.glob(".destroyed-*") if self._root.is_dir() else ():  # a destroy cut short
            self._remove(leftover)

    def create(self, owner: str, name: str) -> VolumeRecord:
        with self._lock:
            mine = self.owned(owner)
            if any(record.name == name for record in mine):
                raise VolumeError(409, f"volume {name!r} already exists")
            if len(mine) >= MAX_VOLUMES_PER_OWNER:
                raise VolumeError(400, f"a key may have {MAX_VOLUMES_PER_OWNER} volumes: destroy one first")
            record = VolumeRecord(
                volume_id="".join(secrets.choice(_ID_ALPHABET) for _ in range(20)), name=name, owner=owner,
                token=secrets.token_hex(32), created_at=time.time(),
            )  # fmt: skip
            directory = self._root / record.volume_id
            directory.mkdir(parents=True, mode=0o700)
            try:
                self._disks.format(directory, self._size_mb, DEFAULT_UID)
                (directory / _RECORD).write_bytes(msgspec.json.encode(record))
            except BaseException:
                self._remove(directory)
                raise
            return record

    def owned(self, owner: str) -> list[VolumeRecord]:
        """The key's volumes, oldest first."""
        found = [record for record in self._records() if record.owner == owner]
        return sorted(found, key=lambda record: (record.created_at, record.volume_id))

    def get(self, owner: str, volume_id: str) -> VolumeRecord:
        """The key's volume `volume_id`; 404 for an unknown one or another key's."""
        record = self._record(volume_id)
        if record is None or record.owner != owner:
            raise VolumeError(404, f"volume {volume_id} not found")
        return record

    def by_token(self, volume_id: str, token: str) -> VolumeRecord | None:
        """The volume whose content API `token` opens, or None (constant-time comparison)."""
        record = self._record(volume_id)
        if record is None or not secrets.compare_digest(record.token.encode(), token.encode()):
            return None
        return record

    def files(self, volume_id: str) -> Path:
        """The volume's files (mounted again after a reboot), for the content API and for mounts; 404 once it is
        destroyed (under the lock: a destroy never meets a call that mounts it again)."""
        with self._lock:
            if self._record(volume_id) is None:
                raise VolumeError(404, f"volume {volume_id} not found")
            directory = self._root / volume_id
            self._disks.attach(directory)
            return directory / "disk"

    # The content API (`_volume_files`): `path` is the client's, under the volume's root.

    def entry(self, volume_id: str, path: str) -> dict[str, object]:
        return _volume_files.entry_of(self.files(volume_id), path)

    def listing(self, volume_id: str, path: str, depth: int) -> list[dict[str, object]]:
        return _volume_files.list_dir(self.files(volume_id), path, depth)

    def make_dir(self, volume_id: str, path: str, ids: Ownership, *, force: bool) -> dict[str, object]:
        return _volume_files.make_dir(self.files(volume_id), path, uid=ids[0], gid=ids[1], mode=ids[2], force=force)

    def open_for_read(self, volume_id: str, path: str) -> tuple[int, int]:
        return _volume_files.open_for_read(self.files(volume_id), path)

    def upload(self, volume_id: str, path: str, ids: Ownership) -> Upload:
        return Upload(self.files(volume_id), path, uid=ids[0], gid=ids[1], mode=ids[2])

    def update(self, volume_id: str, path: str, ids: Ownership) -> dict[str, object]:
        return _volume_files.update(self.files(volume_id), path, uid=ids[0], gid=ids[1], mode=ids[2])

    def remove(self, volume_id: str, path: str) -> None:
        _volume_files.remove(self.files(volume_id), path)

    def destroy(self, owner: str, volume_id: str) -> None:
        """Remove the volume and its files (the caller checked that no sandbox mounts it). Its directory is
        renamed out of the store first, under the lock, so no call finds it while its files go."""
        with self._lock:
            record = self.get(owner, volume_id)
            doomed = self._root / f".destroyed-{record.volume_id}"
            (self._root / record.volume_id).rename(doomed)
        self._remove(doomed)

    def detach_all(self) -> None:
        """Unmount every volume's filesystem (when no sandbox runs: `cleanup`); the next use mounts it again."""
        for record in self._records():
            self._disks.detach(self._root / record.volume_id)

    def _remove(self, directory: Path) -> None:
        self._disks.detach(directory)
        shutil.rmtree(directory, ignore_errors=True)

    def _record(self, volume_id: str) -> VolumeRecord | None:
        if not volume_id or any(c not in _ID_ALPHABET for c in volume_id):
            return None
        try:
            return msgspec.json.decode((self._root / volume_id / _RECORD).read_bytes(), type=VolumeRecord)
        except (FileNotFoundError, msgspec.DecodeError):
            return None

    def _records(self) -> list[VolumeRecord]:
        if not self._root.is_dir():
            return []
        return [record for entry in os.scandir(self._root) if (record := self._record(entry.name)) is not None]
