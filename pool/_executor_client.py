"""The few calls the control plane makes to a sandbox's executor, over a socket the runtime opened."""

from __future__ import annotations

import asyncio
import socket

import msgspec

from pool._errors import RuntimeFailure
from pool._runtime import ExecutorInit

__all__ = ["post_init"]

_encoder = msgspec.json.Encoder()
_INIT_TIMEOUT = 10.0


async def post_init(sock: socket.socket, init: ExecutorInit, current_token: str | None) -> None:
    """Apply env vars, access token and default user to a running executor (envd's `POST /init`)."""
    body = _encoder.encode(init)
    token = f"X-Access-Token: {current_token}\r\n" if current_token else ""
    head = (
        f"POST /init HTTP/1.1\r\nHost: executor\r\nContent-Type: application/json\r\n{token}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        async with asyncio.timeout(_INIT_TIMEOUT):
            writer.write(head + body)
            status_line = await reader.readline()
    except (OSError, TimeoutError) as exc:
        raise RuntimeFailure(f"executor did not answer POST /init: {exc!r}") from exc
    finally:
        writer.close()
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].startswith(b"2"):
        raise RuntimeFailure(f"executor refused POST /init: {status_line.decode(errors='replace').strip()}")
