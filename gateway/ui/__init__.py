"""The web UI at `/ui`: sign in with an API key, then watch and manage that key's sandboxes, templates and pools.

Other modules import only the names listed here; `docs/ui.md` describes the pages and the security model.
"""

from gateway.ui._router import ui_router
from gateway.ui._services import KeyVerifier, PoolStats, UiActivator, UiServices
from gateway.ui._sessions import Sessions, SessionStore
from gateway.ui._shared_sessions import SharedSessionStore

__all__ = [
    "KeyVerifier",
    "PoolStats",
    "SessionStore",
    "Sessions",
    "SharedSessionStore",
    "UiActivator",
    "UiServices",
    "ui_router",
]
