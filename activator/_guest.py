"""E2B's `requireHealthyGuest` (`pause(strict=True)`): pause only a sandbox whose guest agent answers.

The guest agent is the executor (envd). It is asked `GET /health` straight through the runtime's socket into the
sandbox (not the gateway's opener: the probe must neither wake the sandbox nor count as traffic), and must answer
within `GUEST_DEADLINE` seconds. A snapshot of a sandbox whose executor hangs would bring the hang back at every
resume; E2B answers 503 and leaves the sandbox running, and so does `Activator.pause`.
"""

from __future__ import annotations

import asyncio

from activator._records import SandboxRecord
from pool import ENVD_PORT, EnvdClient, ExecutorError, PoolError, Runtime, SocketTransport

__all__ = ["GUEST_DEADLINE", "guest_answers"]

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
