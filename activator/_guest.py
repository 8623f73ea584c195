"""E2B's `requireHealthyGuest` (`pause(strict=True)`): pause only a sandbox whose guest agent answers.

The guest agent is the executor (envd). It is asked `GET /health` straight through the runtime's socket into the
sandbox (not the gateway's opener: the probe must neither wake the sandbox nor count as traffic), and must answer
within `GUEST_DEADLINE` seconds. A snapshot of a sandbox whose executor hangs would bring the hang back at every
resume; E2B answers 503 and leaves the sandbox running, and so does `Activator.pause`. A sandbox the idle policy
froze or scaled to zero has no executor to ask (it answered when it went idle) and passes.
"""

from __future__ import annotations

import asyncio

from activator._errors import GuestUnresponsive
from activator._records import SandboxRecord, SandboxState
from pool import ENVD_PORT, EnvdClient, ExecutorError, PoolError, Runtime, SocketTransport

__all__ = ["GUEST_DEADLINE", "guest_answers", "require_healthy_guest"]

GUEST_DEADLINE = 2.0  # seconds the executor has to answer /health


async def guest_answers(runtime: Runtime, record: SandboxRecord) -> bool:
    """Whether the executor of the sandbox of `record` answers `/health` within `GUEST_DEADLINE` seconds."""
    transport = SocketTransport(lambda: runtime.open_socket(record.id, ENVD_PORT), deadline=GUEST_DEADLINE)
    client = EnvdClient(transport, token=record.access_token)
    try:
        async with asyncio.timeout(GUEST_DEADLINE):
            await client.get("/health")
    except (TimeoutError, ExecutorError, PoolError, OSError):
        return False
    return True


async def require_healthy_guest(runtime: Runtime, record: SandboxRecord) -> None:
    """GuestUnresponsive (503) unless the sandbox is not running or its executor answers."""
    if record.state is SandboxState.RUNNING and not await guest_answers(runtime, record):
        raise GuestUnresponsive(
            f"sandbox {record.id} was not paused: its executor did not answer within {GUEST_DEADLINE:g} s "
            "(requireHealthyGuest)"
        )
