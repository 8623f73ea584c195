"""What the activator stores: one `SandboxRecord` per sandbox and one `ApiKey` per API key.

Both are kept in the store as msgspec JSON and follow msgspec's schema-evolution rules: a field added later always
gets a default and an existing field never changes its type, so records written by an older server still decode.
"""

from __future__ import annotations

import enum
import secrets
import string
from datetime import UTC, datetime
from typing import Annotated, Literal

import msgspec

from pool import ALL_TRAFFIC, EgressRules, VolumeMount

__all__ = [
    "MAX_SANDBOX_ID_LENGTH",
    "ApiKey",
    "CreateRequest",
    "Egress",
    "Ingress",
    "KeyLimits",
    "Lifecycle",
    "PauseReason",
    "SandboxRecord",
    "SandboxState",
    "SnapshotKind",
    "new_access_token",
    "new_sandbox_id",
    "record_time",
]

_ID_ALPHABET = string.ascii_lowercase + string.digits
_ID_LENGTH = 20
# The longest sandbox id any API takes (a path, a Host, `E2b-Sandbox-Id`): ours have `_ID_LENGTH`, the bound leaves
# room to grow and answers a 10 kB id 400 before any lookup.
MAX_SANDBOX_ID_LENGTH = 64

_Count = Annotated[int, msgspec.Meta(ge=0)]
# idle: the idle policy's, invisible on the E2B API; crash: its processes ended by themselves (`crash` says why)
PauseReason = Literal["api", "timeout", "idle", "crash"]
SnapshotKind = Literal["criu", "filesystem"]  # what the runtime's snapshot kept (pool.SnapshotKind)


class SandboxState(enum.StrEnum):
    """Where a sandbox is in its lifecycle (the design's state diagram)."""

    RUNNING = "running"  # processes run; the TTL counts down from `end_at`
    PAUSED = "paused"  # processes frozen, memory kept (0 CPU)
    SNAPSHOTTED = "snapshotted"  # no process, no memory: the files on disk (and a CRIU image, when there is one)
    KILLED = "killed"  # processes gone for good; the record stays until the reaper purges it


class Lifecycle(msgspec.Struct, frozen=True, kw_only=True):
    """What happens when the TTL runs out, and whether traffic may wake the sandbox after a pause."""

    on_timeout: Literal["kill", "pause"] = "kill"
    auto_resume: bool = False


class Egress(msgspec.Struct, frozen=True, kw_only=True):
    """What the sandbox may reach, in E2B's terms: the `allowOut` / `denyOut` in force (checked by `_network`,
    with `allow_internet_access=false` folded in), as `get_info` reports them."""

    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()

    @property
    def rules(self) -> EgressRules:
        """The runtime's form, where E2B's ALL_TRAFFIC (`0.0.0.0/0`) stands for every address of both families."""
        return EgressRules(allow_out=_both_families(self.allow_out), deny_out=_both_families(self.deny_out))


class Ingress(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateway enforces on requests to the sandbox's ports other than envd's."""

    traffic_access_token: str | None = None  # the `e2b-traffic-access-token` they need; None: public (E2B's default)
    mask_request_host: str | None = None  # the Host they arrive with, `${PORT}` replaced; None: the client's
    # The ports that need the token: None every one (`allowPublicTraffic=false`); else only these, the template's
    # private ports of a sandbox whose traffic is otherwise public.
    private_ports: tuple[int, ...] | None = None
    local_host_ports: tuple[int, ...] = ()  # the template's: see `pool.Template.local_host_ports`
    https_ports: tuple[int, ...] = ()  # E2B's `httpsPorts`: served over TLS inside, so the proxy speaks TLS to them

    @property
    def public(self) -> bool:
        """E2B's `allowPublicTraffic`: whether ports other than the template's private ones are open to anyone."""
        return self.traffic_access_token is None or self.private_ports is not None

    def needs_token(self, port: int) -> bool:
        return self.traffic_access_token is not None and (self.private_ports is None or port in self.private_ports)


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
    # Paused or snapshotted by the user (E2B pause, or a timeout with on_timeout=pause): the TTL is stopped and
    # `remaining` holds what was left of it. By the idle policy: the TTL keeps running from `end_at`, as if the
    # sandbox were running (which is what the E2B API reports).
    remaining: float = 0.0
    pause_reason: PauseReason | None = None  # None while running
    snapshot_kind: SnapshotKind | None = None  # set once a snapshot finished, while snapshotted
    crash: str | None = None  # why its processes ended by themselves, while it stays snapshotted after that
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
    egress: Egress = Egress()
    ingress: Ingress = Ingress()  # holds a secret (the traffic token): never in logs or on runtime objects
    volumes: tuple[VolumeMount, ...] = ()  # the key's volumes it mounts, resolved from their names at create

    @property
    def user_paused(self) -> bool:
        """Paused or snapshotted by the user or by its timeout, not by the idle policy: E2B reports it `paused`."""
        return self.state is not SandboxState.RUNNING and self.pause_reason != "idle"

    @property
    def reported_state(self) -> SandboxState:
        """What the E2B API reports: an idle pause is transparent, so the sandbox still reads as running."""
        if self.state is SandboxState.KILLED:
            return self.state
        return SandboxState.PAUSED if self.user_paused else SandboxState.RUNNING

    @property
    def wakes_on_traffic(self) -> bool:
        """Whether a data-plane request may resume it: always after an idle pause, else only with auto-resume."""
        return self.state is SandboxState.RUNNING or self.pause_reason == "idle" or self.lifecycle.auto_resume


class KeyLimits(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one API key's live sandboxes may hold at once (`_quota`): each None takes the server's default
    (`serve --key-max-*`), 0 is unlimited."""

    max_sandboxes: _Count | None = None
    max_memory_mb: _Count | None = None
    max_vcpus: _Count | None = None

    def over(self, defaults: KeyLimits) -> KeyLimits:
        """These limits with `defaults` filling in the ones left to the server."""
        return KeyLimits(
            max_sandboxes=_first_set(self.max_sandboxes, defaults.max_sandboxes),
            max_memory_mb=_first_set(self.max_memory_mb, defaults.max_memory_mb),
            max_vcpus=_first_set(self.max_vcpus, defaults.max_vcpus),
        )


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    """An API key as listed: never the key itself, which is stored only as its SHA-256 digest.

    A revoked key stays listed with the time it was revoked: it verifies no more, and once the server's grace
    period (`serve --revoked-key-grace`) has passed since then the reaper kills its sandboxes.
    """

    id: str
    name: str
    created_at: float
    limits: KeyLimits = KeyLimits()
    revoked_at: float | None = None


class CreateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A create request with the protocol's defaults already applied (the E2B layer applies v1's or v2's)."""

    template: str  # template name or alias
    timeout: float
    metadata: dict[str, str] = {}
    env_vars: dict[str, str] = {}
    secure: bool = True
    lifecycle: Lifecycle = Lifecycle()
    allow_internet_access: bool | None = None
    egress: Egress = Egress()
    public_traffic: bool = True  # False: the sandbox gets a traffic access token (`Ingress`)
    mask_request_host: str | None = None
    https_ports: tuple[int, ...] = ()  # checked: 1..65535, not envd's, sorted, each once
    volume_mounts: tuple[tuple[str, str], ...] = ()  # (the key's volume name, the path inside), paths checked


def _first_set(value: int | None, default: int | None) -> int | None:
    return default if value is None else value


def new_sandbox_id() -> str:
    """20 random lowercase alphanumerics: no `-`, because hostnames `<port>-<id>.<domain>` are split on it."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LENGTH))


def new_access_token() -> str:
    """A random envd access token (or traffic access token)."""
    return secrets.token_hex(32)


def _both_families(entries: tuple[str, ...]) -> tuple[str, ...]:
    """E2B's ALL_TRAFFIC names IPv4 only (its sandboxes have no IPv6); ours stands for `pool.ALL_TRAFFIC`."""
    expanded = (part for entry in entries for part in (ALL_TRAFFIC if entry == ALL_TRAFFIC[0] else (entry,)))
    return tuple(dict.fromkeys(expanded))


def record_time(unix: float) -> datetime:
    """A stored time as the API renders it: UTC, rounded to the microsecond (half to even, as `datetime` does).

    Filters compare through this too (`started_after`), so a time the client read back always matches itself.
    """
    return datetime.fromtimestamp(unix, UTC)
