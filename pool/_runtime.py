"""The interface every runtime implements (`local` here, `kubernetes` later) and the types it speaks."""

from __future__ import annotations

import socket
from typing import Protocol

import msgspec

from pool._templates import Template

__all__ = ["ExecutorInit", "Runtime", "SandboxSpec", "SandboxStats"]


class ExecutorInit(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """What the control plane applies to a sandbox's executor (envd's `POST /init`), also on warm claims."""

    env_vars: dict[str, str] = {}
    access_token: str | None = None
    default_user: str | None = None
    default_workdir: str | None = None


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a runtime needs to start one sandbox."""

    sandbox_id: str
    template: Template
    init: ExecutorInit


class SandboxStats(msgspec.Struct, frozen=True, kw_only=True):
    """Resource figures read from the sandbox's cgroups and its writable layer."""

    cpu_count: int
    cpu_used_pct: float
    cpu_seconds: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


class Runtime(Protocol):
    """Starts, freezes and stops sandboxes and opens connections into them.

    Every method is idempotent per sandbox ID; `stop` removes everything the sandbox had on the host
    except what `keep_files=True` asks to keep (its writable layer).
    """

    async def start(self, spec: SandboxSpec) -> None:
        """Start the sandbox and return once its executor answers."""

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        """Kill every process of the sandbox and release its resources."""

    async def freeze(self, sandbox_id: str) -> None:
        """Freeze every process (memory kept, no CPU)."""

    async def thaw(self, sandbox_id: str) -> None:
        """Undo `freeze`."""

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected, non-blocking TCP socket to `127.0.0.1:port` inside the sandbox."""

    def is_running(self, sandbox_id: str) -> bool:
        """Whether the sandbox's processes exist (frozen or not)."""

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """Current resource use."""

    async def recover(self) -> set[str]:
        """After a restart of the server: the IDs of sandboxes whose processes still run."""
