"""What the catalog keeps of templates API keys build (E2B's Template SDK): templates, their builds and tags.

A template belongs to the key that built it and has a name unique for that key; each build is a version of it,
and tags name builds (`name:tag`; `default` when none is named). A build that finished holds the resolved
`pool.Template` sandboxes start from, so a tag moved to a later build leaves the sandboxes of the earlier one
as they were. The store keeps both as msgspec JSON (`TemplateLedger`).
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

from activator._logs import LogLevel
from pool import Template

__all__ = ["BuildLogEntry", "BuildRecord", "BuildStatus", "TemplateLedger", "TemplateRecord"]

BuildStatus = Literal["waiting", "building", "ready", "error"]


class BuildLogEntry(msgspec.Struct, frozen=True, kw_only=True):
    timestamp: float  # unix seconds
    level: LogLevel
    message: str
    step: str | None = None  # E2B's step label: "base", "1".. (the SDK's own step numbers), "finalize"


class BuildRecord(msgspec.Struct, frozen=True, kw_only=True):
    build_id: str  # a UUID, as E2B's
    template_id: str
    status: BuildStatus
    created_at: float
    finished_at: float | None = None
    template: Template | None = None  # once ready: what sandboxes of this build start from
    reason: str = ""  # why it failed
    reason_step: str | None = None
    logs: tuple[BuildLogEntry, ...] = ()  # kept whole once finished; the builder's own copy while it runs
    cpu_count: int = 2
    memory_mb: int = 1024
    disk_bytes: int = 0  # a snapshot's: what its own files take on disk (0: no snapshot, or taken before this count)


class TemplateRecord(msgspec.Struct, frozen=True, kw_only=True):
    template_id: str
    owner: str  # the API key id that built it
    name: str
    tags: dict[str, str] = {}  # tag -> build id
    created_at: float
    updated_at: float
    snapshot_of: str = ""  # a snapshot's (E2B `create_snapshot`): the sandbox its latest build was taken of
    # Deleted while sandboxes stood on its builds: kept for them alone (a restart must still find what they
    # start from again), named by no listing or create, until the first start of the server that none does.
    deleted: bool = False


class TemplateLedger(Protocol):
    """Where templates and builds persist (SQLite on this machine)."""

    async def put_template(self, record: TemplateRecord) -> None: ...

    async def delete_template(self, template_id: str) -> None:
        """The template and every build of it."""

    async def put_build(self, record: BuildRecord) -> None: ...

    async def built_templates(self) -> list[tuple[TemplateRecord, list[BuildRecord]]]:
        """Every template with its builds, oldest first."""
