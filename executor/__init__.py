"""The envd-compatible daemon that runs inside every sandbox: `python3 -m executor --help`.

It serves E2B's envd protocol (processes, filesystem, /files) on port 49983 and reaps every
process of its sandbox. It imports nothing from the rest of agent-sandbox, and nothing beyond the
standard library, msgspec and httptools.
"""

from executor._app import App, Settings
from executor._defaults import Defaults
from executor._main import main

__all__ = ("App", "Defaults", "Settings", "main")
