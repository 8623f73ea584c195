"""What a context needs from the thing that runs its code: a Jupyter kernel or a Node.js process.

    InterpreterError            base: a message for the client, plain text with `status`
     ├── BadRequest             400  malformed body, context and language both given, bad cwd, unknown language
     ├── ContextNotFound        404  `Context <id> not found` (the SDK raises NotFoundException on it)
     └── BackendFailed          500  a kernel or process did not start

A backend runs one execution at a time (its context serializes them) and reports output through `emit`
as it happens. `stop` asks it to end the execution early: the client went away or the time limit passed.
It must then interrupt the code, and restart itself when the interrupt does not work, so that it is usable
again when `run` returns; likewise when it dies on its own, after saying so with an `error` line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from executor.interpreter._wire import Error, Line

__all__ = (
    "Backend",
    "BackendFactory",
    "BackendFailed",
    "BadRequest",
    "ContextNotFound",
    "Emit",
    "InterpreterError",
    "died",
    "unresponsive",
)

Emit = Callable[[Line], None]

INTERRUPT_GRACE_SECONDS = 3.0
"""How long an interrupted execution may take to stop before its backend is restarted instead."""


class InterpreterError(Exception):
    """An error with a message meant for the client."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(InterpreterError):
    """The request cannot be served as sent."""

    status = 400


class Unauthorized(InterpreterError):
    """The caller did not present the sandbox's access token."""

    status = 401


class ContextNotFound(InterpreterError):
    """No context has the requested ID."""

    status = 404


class BackendFailed(InterpreterError):
    """A kernel or interpreter process could not be started."""

    status = 500


class Backend(Protocol):
    """Runs code for one context, keeping its state between executions."""

    async def start(self) -> None:
        """Start the kernel or process; raise BackendFailed when it does not come up."""

    async def run(self, code: str, env: Mapping[str, str], emit: Emit, stop: asyncio.Event) -> None:
        """Run `code` with `env` added to the environment for this execution only; return when it is over."""

    async def restart(self) -> None:
        """Start afresh: every variable and import is gone."""

    async def close(self) -> None:
        """Stop the kernel or process and remove what it left on disk."""


BackendFactory = Callable[[str, str], Backend]
"""(language, cwd) -> a backend that is not started yet."""


async def restart_after(backend: Backend, emit: Emit, error: Error) -> None:
    """An execution lost its interpreter: log it, start the interpreter afresh, and tell the client why."""
    logging.getLogger("interpreter").warning("%s", error.value)
    await backend.restart()
    emit(error)


def died(what: str, detail: str) -> Error:
    """The `error` line for an execution whose interpreter died under it (and was restarted)."""
    return _restarted("KernelDied", f"The {what} died ({detail})")


def unresponsive(what: str) -> Error:
    """The `error` line for an execution that ignored its interrupt, so its interpreter was restarted."""
    return _restarted(
        "KernelRestarted", f"The {what} did not stop within {INTERRUPT_GRACE_SECONDS:g} s of an interrupt"
    )


def _restarted(name: str, what_happened: str) -> Error:
    value = f"{what_happened} and was restarted: the variables and imports of this context are lost"
    return Error(name=name, value=value, traceback=f"{name}: {value}")
