"""Persistent named volumes (E2B's Volume API): what a runtime keeps and what a sandbox mounts."""

from __future__ import annotations

import msgspec

__all__ = ["MAX_VOLUMES_PER_OWNER", "MAX_VOLUME_MOUNTS", "VOLUME_SIZE_MB", "Ownership", "VolumeMount", "VolumeRecord"]

VOLUME_SIZE_MB = 10240
"""Each volume's size: its own filesystem of this many MiB (sparse: it holds what was written)."""
MAX_VOLUMES_PER_OWNER = 100
"""Volumes one API key may have."""
MAX_VOLUME_MOUNTS = 10
"""Volumes one sandbox may mount."""


Ownership = tuple[int | None, int | None, int | None]
"""uid, gid and mode a content call sets (None: the default; for an update, unchanged)."""


class VolumeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One volume: its key's, by id and by name; `token` authorises the content API for it alone."""

    volume_id: str
    name: str
    owner: str
    token: str
    created_at: float


class VolumeMount(msgspec.Struct, frozen=True, kw_only=True):
    """A volume mounted into a sandbox at `path` (absolute, inside the sandbox)."""

    volume_id: str
    name: str
    path: str
