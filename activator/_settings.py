"""The activator's settings: lifecycle policy knobs, decoded once at start-up and passed to `Activator`."""

from __future__ import annotations

from typing import Annotated

import msgspec

from activator._quota import DEFAULT_KEY_LIMITS
from activator._records import KeyLimits
from executor.envd import ENVD_VERSION

__all__ = ["ActivatorSettings"]

_Seconds = Annotated[int, msgspec.Meta(ge=0)]
_Positive = Annotated[float, msgspec.Meta(gt=0)]


class ActivatorSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Lifecycle policy; build it with `msgspec.convert(values, ActivatorSettings, strict=False)` to validate.

    Cross-field rules are checked on construction, the per-field bounds by `msgspec.convert`.
    """

    default_timeout: _Seconds = 300  # E2B v2 create and connect without `timeout`
    default_timeout_v1: _Seconds = 15  # E2B v1 create and resume without `timeout`
    max_timeout: Annotated[int, msgspec.Meta(ge=1)] = 86_400  # the longest TTL one request may set (E2B: 24 h)
    reap_interval: _Positive = 1.0  # seconds between two passes of the timeout / idle reaper
    killed_retention: Annotated[float, msgspec.Meta(ge=0)] = 3600.0  # seconds a killed record stays in the store
    hold_deadline: _Positive = 60.0  # seconds a data-plane request may wait for its sandbox to resume
    max_held: Annotated[int, msgspec.Meta(ge=1)] = 10_000  # data-plane requests waiting at once, all sandboxes
    # The idle policy, for every template: seconds without traffic before a sandbox is frozen / snapshotted.
    # None keeps each template's own `pause_after` / `snapshot_after`; 0 turns that step off.
    pause_after: Annotated[float, msgspec.Meta(ge=0)] | None = None
    snapshot_after: Annotated[float, msgspec.Meta(ge=0)] | None = None
    log_lines: Annotated[int, msgspec.Meta(ge=1)] = 500  # lifecycle log lines kept per sandbox
    envd_version: str = ENVD_VERSION  # reported to SDKs, which gate features on it
    domain: str | None = None  # where sandbox ports are served, `<port>-<id>.<domain>`; reported to SDKs
    client_id: str = "agent-sandbox"  # E2B's deprecated but required `clientID`
    default_internet: bool = True  # a create without `allow_internet_access` reaches the internet (E2B's default)
    warm_builds: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0  # warm sandboxes per tagged build of a key's template
    build_timeout: _Positive = 3600.0  # seconds one template build may take, from its first layer to its trial start
    # MiB of disk one API key's snapshots may take together, memory images included (0: unlimited).
    key_snapshot_mb: Annotated[int, msgspec.Meta(ge=0)] = 20_480
    template_aliases: dict[str, str] = {}  # extra template names, e.g. {"code-interpreter-v1": "code-interpreter"}
    # What one API key's live sandboxes may hold where its own record leaves a limit to the server (0: unlimited).
    key_limits: KeyLimits = DEFAULT_KEY_LIMITS
    # Seconds a revoked key's sandboxes live on before the reaper kills them (0: at its next sweep).
    revoked_key_grace: Annotated[float, msgspec.Meta(ge=0)] = 3600.0

    def __post_init__(self) -> None:
        longest = max(self.default_timeout, self.default_timeout_v1)
        if longest > self.max_timeout:
            raise ValueError(f"default timeouts ({longest} s) exceed max_timeout ({self.max_timeout} s)")
