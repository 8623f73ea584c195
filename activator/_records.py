"""What the activator stores: one `SandboxRecord` per sandbox and one `ApiKey` per API key.

Both are kept in the store as msgspec JSON and follow msgspec's schema-evolution rules: a field added later always
gets a default and an existing field never changes its type, so records written by an older server still decode.
"""

from __future__ import annotations

import enum
import secrets
import string
from typing import Literal

import msgspec

__all__ = [
    "ApiKey",
    "CreateRequest",
    "Lifecycle",
    "PauseReason",
    "SandboxRecord",
    "SandboxState",
    "new_access_token",
    "new_sandbox_id",
]

_ID_ALPHABET = string.ascii_lowercase + string.digits
_ID_LENGTH = 20

PauseReason = Literal["api", "timeout", "idle"]


class SandboxState(enum.StrEnum):
    """Where a sandbox is in its lifecycle (the design's state diagram)."""

    RUNNING = "running"  # processes run; the TTL counts down from `end_at`
    PAUSED = "paused"  # processes frozen, memory kept; the TTL is stopped, `remaining` holds what is left of it
    KILLED = "killed"  # processes gone for good; the record stays until the reaper purges it
    # SNAPSHOTTED will join here: processes gone, filesystem kept; like PAUSED for the TTL and on the wire.


class Lifecycle(msgspec.Struct, frozen=True, kw_only=True):
    """What happens when the TTL runs out, and whether traffic may wake the sandbox after a pause."""

    on_timeout: Literal["kill", "pause"] = "kill"
    auto_resume: bool = False


class SandboxRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The stored form of one sandbox; transitions replace it whole (`msgspec.structs.replace`)."""

    id: str
    owner: str  # id of the API key that created it; no other key sees it
    template: str  # the template's name, E2B's `templateID`
    alias: str  # the name the client asked for (a template name or an alias)
    state: SandboxState
    created_at: float  # unix seconds
    started_at: float  # unix seconds of the create or of the last resume
    end_at: float  # unix seconds of the deadline while running; the kill time once killed
    timeout: float  # the TTL asked for at create, granted again when traffic auto-resumes it
    remaining: float = 0.0  # seconds of TTL left, kept while paused so that paused time does not count
    pause_reason: PauseReason | None = None
    metadata: dict[str, str] = {}
    env_vars: dict[str, str] = {}
    access_token: str | None = None  # envd's X-Access-Token; None means envd accepts any caller
    lifecycle: Lifecycle = Lifecycle()
    secure: bool = True
    allow_internet_access: bool | None = None
    cpu_count: int = 1
    memory_mb: int = 512
    disk_mb: int = 2048
    client_id: str = ""
    envd_version: str = "0.5.7"
    domain: str | None = None  # the sandbox hostnames' domain, `<port>-<id>.<domain>`, told to the SDKs


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    """An API key as listed: never the key itself, which is stored only as its SHA-256 digest."""

    id: str
    name: str
    created_at: float


class CreateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A create request with the protocol's defaults already applied (the E2B layer applies v1's or v2's)."""

    template: str  # template name or alias
    timeout: float
    metadata: dict[str, str] = {}
    env_vars: dict[str, str] = {}
    secure: bool = True
    lifecycle: Lifecycle = Lifecycle()
    allow_internet_access: bool | None = None


def new_sandbox_id() -> str:
    """20 random lowercase alphanumerics: no `-`, because hostnames `<port>-<id>.<domain>` are split on it."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))


def new_access_token() -> str:
    """A random envd access token."""
    return secrets.token_hex(32)
