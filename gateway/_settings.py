"""Server settings: command-line flags, each also readable from `AGENT_SANDBOX_<NAME>`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

__all__ = ["DEFAULT_TEMPLATES", "ServeSettings"]

DEFAULT_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


class ServeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything `agent-sandbox serve` is configured with; read once at start and passed down."""

    host: str = "127.0.0.1"
    port: int = 3000
    domain: str = "sandbox.localhost"
    data_dir: Path = Path("/var/lib/agent-sandbox")
    image_cache: Path = Path("/var/cache/agent-sandbox/images")
    templates: Path = DEFAULT_TEMPLATES
    api_key: str | None = None
    tls_cert: Path | None = None  # serve HTTPS with this certificate chain (e.g. a wildcard for *.<domain>)
    tls_key: Path | None = None
    log_level: str = "info"

    @property
    def cgroup_name(self) -> str:
        """A parent cgroup per data directory, so servers sharing a machine never touch each other's."""
        return "agent-sandbox-" + hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:10]

    @property
    def executor_source(self) -> Path:
        return Path(__file__).resolve().parent.parent / "executor"
