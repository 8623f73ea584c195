"""Errors of the pool and its runtimes. OS, subprocess and CRIU failures are re-raised as these.

PoolError                base class
├── RuntimeFailure       a sandbox could not be started, frozen, stopped or reached
│   └── PortClosed       nothing listens on the requested port inside the sandbox
├── ExecutorError        the exchange with a sandbox's executor (envd) broke, or was not HTTP
│   └── ExecutorRefused  the executor answered with an error (`code`: Connect's, or the HTTP status of /files etc.)
├── SandboxGone          the runtime has no sandbox with that ID (never started, or stopped)
└── ImageBuildError      a template's layers could not be built
"""

from __future__ import annotations

__all__ = [
    "CheckpointFailed",
    "ExecutorError",
    "ExecutorRefused",
    "ImageBuildError",
    "PoolError",
    "PortClosed",
    "RuntimeFailure",
    "SandboxGone",
    "TemplateBuildFailed",
    "VolumeError",
]


class PoolError(Exception):
    """Base class of everything the pool raises."""


class RuntimeFailure(PoolError):
    """The runtime could not carry out an operation on a sandbox."""


class CheckpointFailed(RuntimeFailure):
    """A memory snapshot failed where only files would be left of processes the template does not restart: the
    sandbox runs on as it was (the caller freezes it instead), never coming back as a fresh start."""


class PortClosed(RuntimeFailure):
    """The connection to a port inside the sandbox was refused."""


class ExecutorError(PoolError):
    """The connection to a sandbox's executor failed, closed early, or carried something that is not HTTP."""


class ExecutorRefused(ExecutorError):
    """The executor answered with an error: `code` ("not_found", ...; the HTTP status for /files, /init and
    /agent-sandbox/*) and its `message`."""

    def __init__(self, code: str | int, message: str) -> None:
        super().__init__(f"the executor refused the call: {code}: {message}")
        self.code = code
        self.message = message


class SandboxGone(PoolError):
    """No such sandbox in this runtime."""


class ImageBuildError(PoolError):
    """Building a template layer failed; the message carries the failing command's output tail."""


class TemplateBuildFailed(PoolError):
    """A template build failed at a layer (`layer`: its index in `Template.layers`) or, `layer` None, while its
    start and ready commands were tried; the message says what failed with the tail of its output."""

    def __init__(self, message: str, *, layer: int | None) -> None:
        super().__init__(message)
        self.layer = layer


class VolumeError(PoolError):
    """A volume call refused: `status` is the HTTP status it answers (400 a bad path or request, 404 no such
    volume or path, 409 a conflict, 507 the volume is full) and `message` says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
