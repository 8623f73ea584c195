"""The envd-compatible daemon that runs inside every sandbox: `python3 -m executor --help`.

It serves E2B's envd protocol (processes, filesystem, /files) on `envd.ENVD_PORT` and reaps every
process of its sandbox. It imports nothing from the rest of agent-sandbox, and nothing beyond the
standard library, msgspec and httptools.

`executor.envd` is the protocol's wire (messages, port, headers, framing) that its clients import too.
The server's names are imported on first use (PEP 562), so that a client importing `executor.envd`
does not load the server (~50 ms).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from executor import envd

if TYPE_CHECKING:
    from executor._app import App, Settings
    from executor._defaults import Defaults
    from executor._main import main

__all__ = ("App", "Defaults", "Settings", "envd", "main")

_LAZY = {"App": "_app", "Settings": "_app", "Defaults": "_defaults", "main": "_main"}  # name -> module


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'executor' has no attribute {name!r}")
    return getattr(importlib.import_module(f"executor.{_LAZY[name]}"), name)
