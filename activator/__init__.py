"""The lifecycle layer: sandbox records and their state machine, API keys, and the E2B and MCP control planes.

Other packages import only the names listed here.
"""

from activator._activator import Activator, Page, TemplateBuildSource
from activator._agent_archive import AGENT_SESSION_RETENTION, DEFAULT_MAX_TOTAL_BYTES, AgentArchive
from activator._agent_mirror import AgentMirror
from activator._catalog import TemplateCatalog, TemplateNotFound
from activator._coordination import Coordinator, SoloCoordinator
from activator._e2b import (
    ACTIVATOR,
    API_KEYS,
    MAX_BODY_BYTES,
    OPENAPI_PATH,
    e2b_error_response,
    e2b_openapi_config,
    e2b_router,
)
from activator._errors import (
    ActivatorError,
    ClientGone,
    GuestUnresponsive,
    HoldQueueFull,
    HoldTimeout,
    IdempotencyConflict,
    IdempotencyMismatch,
    InvalidRequest,
    PortNotOpen,
    QuotaExceeded,
    SandboxConflict,
    SandboxNotFound,
    TooManyRequests,
    TooManySignIns,
)
from activator._holds import CLIENT_GONE
from activator._idempotency import IDEMPOTENCY_TTL, ClaimedKey, Idempotency, KeyLedger
from activator._keys import KEY_PATTERN, ApiKeys
from activator._kube_store import KubeStore
from activator._logs import LogLine
from activator._mcp import (
    CREATE_DEADLINE,
    DESKTOP_VIEW_COMMAND,
    AgentPort,
    AgentRefused,
    McpServer,
    SandboxUrls,
    ToolError,
    current_page,
    navigate,
    session_path,
)
from activator._metrics_ring import SAMPLE_INTERVAL, SAMPLES_KEPT, Sample
from activator._pacing import RequestPacer
from activator._quota import DEFAULT_KEY_LIMITS
from activator._records import (
    MAX_SANDBOX_ID_LENGTH,
    ApiKey,
    CreateRequest,
    Ingress,
    KeyLimits,
    Lifecycle,
    SandboxRecord,
    SandboxState,
    new_sandbox_id,
)
from activator._redis_coordination import RedisCoordinator
from activator._settings import ActivatorSettings
from activator._signin import SignInLimiter
from activator._sqlite_store import SqliteStore
from activator._store import Store
from activator._telemetry import Histogram, HoldResult, Telemetry
from activator._template_builds import TemplateBuilds
from activator._template_files import TemplateFiles
from activator._template_records import BuildLogEntry, BuildRecord, TemplateRecord

__all__ = [
    "ACTIVATOR",
    "AGENT_SESSION_RETENTION",
    "API_KEYS",
    "CLIENT_GONE",
    "CREATE_DEADLINE",
    "DEFAULT_KEY_LIMITS",
    "DEFAULT_MAX_TOTAL_BYTES",
    "DESKTOP_VIEW_COMMAND",
    "IDEMPOTENCY_TTL",
    "KEY_PATTERN",
    "MAX_BODY_BYTES",
    "MAX_SANDBOX_ID_LENGTH",
    "OPENAPI_PATH",
    "SAMPLES_KEPT",
    "SAMPLE_INTERVAL",
    "Activator",
    "ActivatorError",
    "ActivatorSettings",
    "AgentArchive",
    "AgentMirror",
    "AgentPort",
    "AgentRefused",
    "ApiKey",
    "ApiKeys",
    "BuildLogEntry",
    "BuildRecord",
    "ClaimedKey",
    "ClientGone",
    "Coordinator",
    "CreateRequest",
    "GuestUnresponsive",
    "Histogram",
    "HoldQueueFull",
    "HoldResult",
    "HoldTimeout",
    "Idempotency",
    "IdempotencyConflict",
    "IdempotencyMismatch",
    "Ingress",
    "InvalidRequest",
    "KeyLedger",
    "KeyLimits",
    "KubeStore",
    "Lifecycle",
    "LogLine",
    "McpServer",
    "Page",
    "PortNotOpen",
    "QuotaExceeded",
    "RedisCoordinator",
    "RequestPacer",
    "Sample",
    "SandboxConflict",
    "SandboxNotFound",
    "SandboxRecord",
    "SandboxState",
    "SandboxUrls",
    "SignInLimiter",
    "SoloCoordinator",
    "SqliteStore",
    "Store",
    "Telemetry",
    "TemplateBuildSource",
    "TemplateBuilds",
    "TemplateCatalog",
    "TemplateFiles",
    "TemplateNotFound",
    "TemplateRecord",
    "TooManyRequests",
    "TooManySignIns",
    "ToolError",
    "current_page",
    "e2b_error_response",
    "e2b_openapi_config",
    "e2b_router",
    "navigate",
    "new_sandbox_id",
    "session_path",
]
