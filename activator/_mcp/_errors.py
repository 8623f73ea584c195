"""Errors a tool call reports to the agent as an MCP tool error (`isError: true`), never as a protocol error.

Every message says what went wrong and what to do next, because its reader is a model deciding its next call.

ToolError                 base class: the message is shown to the agent as is
├── UnknownTool           `sandboxExecutor` named a tool the sandbox does not have
├── BadArguments          the arguments do not match the tool's JSON schema
├── FileMissing           read_file / list_files named a path that does not exist
├── CommandTimedOut       a command or code run passed its timeout and was killed
├── ExecutorFailed        the sandbox's executor refused the call or did not answer
└── AgentRefused          the sandbox's coding-agent server answered with a problem document (its `detail`)

The pool's `ExecutorError`s (the executor's client) become `ExecutorFailed` in `executor_failures()`. The
activator's own errors (`SandboxNotFound`, `InvalidRequest`, `TemplateNotFound`, ...) are reported the same
way, with their own messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pool import ExecutorError, ExecutorRefused

__all__ = [
    "AgentRefused",
    "BadArguments",
    "CommandTimedOut",
    "ExecutorFailed",
    "FileMissing",
    "ToolError",
    "UnknownTool",
    "executor_failures",
]


class ToolError(Exception):
    """A tool call failed in a way the agent can act on."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnknownTool(ToolError):
    """The sandbox has no tool of this name."""


class BadArguments(ToolError):
    """The arguments failed validation against the tool's schema."""


class FileMissing(ToolError):
    """The path does not exist in the sandbox."""


class CommandTimedOut(ToolError):
    """The command (or code) ran past its timeout; it was killed, and its partial output is in the message."""


class ExecutorFailed(ToolError):
    """The executor answered with an error, or the connection to it broke."""


class AgentRefused(ToolError):
    """The coding-agent server (port 2468) refused the call; `kind` is the problem's error kind, `status` the HTTP
    status it answered with."""

    def __init__(self, message: str, kind: str, *, status: int = 502) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@contextmanager
def executor_failures() -> Iterator[None]:
    """Re-raise the executor client's errors as ExecutorFailed; a broken exchange is worth retrying."""
    try:
        yield
    except ExecutorRefused as exc:
        raise ExecutorFailed(str(exc)) from exc
    except ExecutorError as exc:
        raise ExecutorFailed(f"{exc}; retry the call") from exc
