"""The one error `agent-sandbox deploy` reports: a message for a person, printed on one line, exit status 1."""

from __future__ import annotations

__all__ = ["DeployError"]


class DeployError(Exception):
    """A deploy, list or delete that cannot go on: a bad directory, an unreachable server, a refused key, a
    server that does not come up. The message says what is wrong and, where it can, what to do."""
