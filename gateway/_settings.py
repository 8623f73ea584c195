"""Server settings: command-line flags, each also readable from `AGENT_SANDBOX_<NAME>`."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

import msgspec

from activator import DEFAULT_KEY_LIMITS, KeyLimits
from pool import HostCeiling

__all__ = ["DEFAULT_TEMPLATES", "ConnectionLimits", "ServeSettings"]

DEFAULT_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


class ConnectionLimits(msgspec.Struct, frozen=True, kw_only=True):
    """How long and how many client connections the gateway keeps (docs/security.md, "Limits")."""

    header_timeout: float = 10.0  # seconds from accept (or a request's first byte) to a complete head; then closed
    body_timeout: float = 30.0  # seconds a request body being read may send nothing; then closed
    keep_alive_timeout: int = 5  # seconds a connection may wait for its next request (uvicorn's, whole seconds)
    max_connections: int = 0  # in total (0: half of what the fd limit leaves past the reserve); then idle evicted
    max_connections_per_client: int | None = None  # per address (None: a quarter of the total, 0: no cap); then 503
    fd_reserve: int = 1024  # file descriptors client connections never take (sandboxes, upstreams, SQLite, CRIU)


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
    # The idle policy for every template, in seconds without traffic (None: each template's own; 0: never).
    pause_after: float | None = None  # then frozen: memory kept, 0 CPU, woken in about a millisecond
    snapshot_after: float | None = None  # then scaled to zero: only disk kept (only when nothing would be lost)
    max_held: int = 10_000  # requests held for waking sandboxes at once, in total; past it 503 + Retry-After
    hold_deadline: float = 60.0  # seconds a held request waits for its sandbox; past it 504
    warm: dict[str, int] = {}  # ready sandboxes kept per template, over the templates' own `warm`
    warm_builds: int = 0  # ready sandboxes kept per tagged build of a key's own template (local runtime)
    key_snapshot_mb: int = 20_480  # MiB of disk one key's snapshots may take together (0: unlimited)
    runtime: Literal["local", "kubernetes"] = "local"
    kubeconfig: Path | None = None  # kubernetes: None means in-cluster (the pod's ServiceAccount)
    namespace: str | None = None  # kubernetes: None means the kubeconfig's (or the pod's) namespace, else "default"
    kube_sandbox_user: Literal["user", "root"] | None = None  # kubernetes: over every template's user (dev cluster)
    kube_sandbox_service_account: str | None = None  # kubernetes: the sandbox pods' ServiceAccount (no token mounted)
    kube_egress_guard_image: str | None = None  # kubernetes: the egress guard's image (None: no guard)
    # kubernetes: the Secret whose `api-key` is the bootstrap key (filled in with a new key when empty)
    api_key_secret: str | None = None
    redis_url: str | None = None  # several replicas: what they share (route cache, activation locks, activity)
    replica_id: str = ""  # this replica's name among the others ("" = the pod's name, else host name and pid)
    lease_duration: float = 15.0  # kubernetes: seconds until another replica takes over a dead leader's loops
    # local: where sandboxes' DNS queries go (() = the host's resolv.conf), CIDRs no sandbox reaches on top of the
    # private ranges, and the extra CAs sandboxes trust (None: only their template's); docs/networking.md
    sandbox_dns: tuple[str, ...] = ()
    sandbox_denied_cidrs: tuple[str, ...] = ()
    sandbox_ca_certs: Path | None = Path("/usr/local/share/ca-certificates")
    sandbox_internet: bool = True  # what a create that leaves `allow_internet_access` out gets (E2B: internet on)
    # What one API key's live sandboxes may hold where its own limits leave it to the server (0: unlimited), and what
    # all sandboxes together may use on this machine (the parent cgroup's ceiling); docs/security.md, "Per-key limits"
    key_limits: KeyLimits = DEFAULT_KEY_LIMITS
    sandboxes_ceiling: HostCeiling = HostCeiling()
    # Revocation and sign-in (docs/security.md, "Keys, sign-in and /metrics"): seconds a revoked key's sandboxes
    # live on; failed key checks a client address may make a minute (0: no limit); whether /metrics wants a key,
    # and the (host, port) of a listener of its own (None: the main one's /metrics)
    revoked_key_grace: float = 3600.0
    # local: seconds a killed sandbox's coding-agent sessions stay readable in the control plane (0: gone with it;
    # None: not given, AGENT_SESSION_RETENTION; given on the kubernetes runtime, which keeps no copy, it is refused)
    agent_session_retention: float | None = None
    agent_session_space_mb: int | None = None  # MiB of all those copies together (None: DEFAULT_MAX_TOTAL_BYTES)
    signin_failures: int = 60
    key_request_rate: int = 100  # requests a second one API key may make (bursts of twice that); 0: unpaced
    metrics_auth: Literal["key", "none"] = "key"
    metrics_listen: tuple[str, int] | None = None
    connections: ConnectionLimits = ConnectionLimits()
    # local: each sandbox's writable layer on a filesystem of its template's disk_mb (off: none; docs/security.md)
    sandbox_disk_limit: bool = True

    @property
    def cgroup_name(self) -> str:
        """A parent cgroup per data directory, so servers sharing a machine never touch each other's."""
        return "agent-sandbox-" + hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:10]

    @property
    def executor_source(self) -> Path:
        return Path(__file__).resolve().parent.parent / "executor"
