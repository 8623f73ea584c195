"""Errors of the pool and its runtimes. OS, subprocess and CRIU failures are re-raised as these.

PoolError                base class
├── RuntimeFailure       a sandbox could not be started, frozen, stopped or reached
│   └── PortClosed       nothing listens on the requested port inside the sandbox
├── SandboxGone          the runtime has no sandbox with that ID (never started, or stopped)
└── ImageBuildError      a template's layers could not be built
"""

from __future__ import annotations

__all__ = ["ImageBuildError", "PoolError", "PortClosed", "RuntimeFailure", "SandboxGone"]


class PoolError(Exception):
    """Base class of everything the pool raises."""


class RuntimeFailure(PoolError):
    """The runtime could not carry out an operation on a sandbox."""


class PortClosed(RuntimeFailure):
    """The connection to a port inside the sandbox was refused."""


class SandboxGone(PoolError):
    """No such sandbox in this runtime."""


class ImageBuildError(PoolError):
    """Building a template layer failed; the message carries the failing command's output tail."""
