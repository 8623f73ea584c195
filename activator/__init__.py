"""The lifecycle layer: sandbox records and their state machine, API keys, and the E2B control plane.

Other packages import only the names listed here.
"""

from activator._activator import Activator, Page
from activator._catalog import TemplateCatalog, TemplateNotFound
from activator._e2b import ACTIVATOR, API_KEYS, MAX_BODY_BYTES, e2b_error_response, e2b_router
from activator._errors import (
    ActivatorError,
    HoldQueueFull,
    HoldTimeout,
    InvalidRequest,
    PortNotOpen,
    SandboxConflict,
    SandboxNotFound,
)
from activator._keys import KEY_PATTERN, ApiKeys
from activator._logs import LogLine
from activator._records import ApiKey, CreateRequest, Lifecycle, SandboxRecord, SandboxState
from activator._settings import ActivatorSettings
from activator._store import Store

__all__ = [
    "ACTIVATOR",
    "API_KEYS",
    "KEY_PATTERN",
    "MAX_BODY_BYTES",
    "Activator",
    "ActivatorError",
    "ActivatorSettings",
    "ApiKey",
    "ApiKeys",
    "CreateRequest",
    "HoldQueueFull",
    "HoldTimeout",
    "InvalidRequest",
    "Lifecycle",
    "LogLine",
    "Page",
    "PortNotOpen",
    "SandboxConflict",
    "SandboxNotFound",
    "SandboxRecord",
    "SandboxState",
    "Store",
    "TemplateCatalog",
    "TemplateNotFound",
    "e2b_error_response",
    "e2b_router",
]
