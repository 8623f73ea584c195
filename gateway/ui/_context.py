"""The UI's one shared object: the platform's services, the session table and the page renderer.

Built once by `ui_router` and handed to every handler as the `ui` dependency. It holds configuration and the
session table only; nothing about a request is ever stored on it.
"""

from __future__ import annotations

from pathlib import Path

import jinja2
from litestar.di import NamedDependency
from litestar.params import FromPath

from gateway.ui._services import UiServices
from gateway.ui._sessions import Sessions

__all__ = ["STATIC_DIR", "SandboxIdPath", "UiContext", "UiDep"]

_HERE = Path(__file__).resolve().parent
STATIC_DIR = _HERE / "static"


class UiContext:
    """Services, sessions and templates of one mounted UI."""

    def __init__(self, services: UiServices, sessions: Sessions, *, refresh: float = 1.0) -> None:
        """`refresh`: seconds between two snapshots of a live page's event stream."""
        if refresh <= 0:
            raise ValueError("refresh must be > 0 seconds")
        self.services = services
        self.sessions = sessions
        self.refresh = refresh
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,  # a misspelt variable fails the test that renders it, not silently
            trim_blocks=True,
            lstrip_blocks=True,
        )


UiDep = NamedDependency[UiContext]  # handler parameter `ui`, provided by `ui_router`
SandboxIdPath = FromPath[str]  # handler parameter `sandbox_id`, the `{sandbox_id}` of the path
