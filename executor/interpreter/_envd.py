"""The sandbox's environment variables, read from the executor's `GET /envs` before each execution.

Like the reference server: variables given to `Sandbox.create(envs=...)` reach the executor through
`/init` after this service may already have started, so each execution asks for the current ones (a local
round trip of about a millisecond) with the caller's access token, which is why the SDK sends
`X-Access-Token` on `/execute`. When the executor cannot be asked, the execution runs without them; when it
refuses the caller's token (a `secure` sandbox, a caller that knows only its id), the execution is refused
too: code run on port 49999 could read the sandbox's secrets from its kernel's environment.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from executor.envd import ACCESS_TOKEN_HEADER, ENVD_PORT

__all__ = ("EnvdClient",)

logger = logging.getLogger("interpreter")

_TIMEOUT = 2.0
_MAX_BYTES = 4 * 1024 * 1024
_decoder = msgspec.json.Decoder(dict[str, str])


class EnvdClient:
    """Reads `/envs` from the executor at `host:port`."""

    def __init__(self, host: str = "127.0.0.1", port: int = ENVD_PORT) -> None:
        self._host = host
        self._port = port
        self._warned = False  # an executor that cannot be reached is logged once, not at every execution

    async def envs(self, access_token: str | None) -> dict[str, str] | None:
        """The sandbox's variables; {} when the executor cannot be asked, None when it refuses the token."""
        token = f"{ACCESS_TOKEN_HEADER}: {access_token}\r\n" if access_token else ""
        request = f"GET /envs HTTP/1.1\r\nHost: executor\r\n{token}Connection: close\r\n\r\n".encode()
        try:
            async with asyncio.timeout(_TIMEOUT):
                reader, writer = await asyncio.open_connection(self._host, self._port)
                try:
                    writer.write(request)
                    raw = await reader.read(_MAX_BYTES)
                    while chunk := await reader.read(_MAX_BYTES):
                        raw += chunk
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            if not self._warned:
                self._warned = True
                logger.warning("cannot read the sandbox's environment from the executor: %r", exc)
            return {}
        return _parse(raw)


def _parse(raw: bytes) -> dict[str, str] | None:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1:2]
    if status in ([b"401"], [b"403"]):
        return None
    if status != [b"200"]:
        logger.warning("the executor answered /envs with %r", head.split(b"\r\n", 1)[0])
        return {}
    try:
        return _decoder.decode(body)
    except msgspec.DecodeError:
        logger.warning("the executor's /envs is not a JSON object of strings")
        return {}
