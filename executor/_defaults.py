"""The sandbox-wide settings the control plane can change at run time through /init."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ("Defaults",)


@dataclass
class Defaults:
    """Read by every request; written only by /init (and --init-file at start-up).

    `env_vars` go to every process the executor starts (after HOME/USER/…, before the request's own);
    `access_token`, when set, is required from every caller except the exempt paths (`_auth`).
    """

    user: str
    env_vars: dict[str, str] = field(default_factory=dict)
    access_token: str | None = None
    workdir: str | None = None
