"""Reading a response body that arrives in chunks: whole within a limit, or only its first bytes.

Every response the envd client reads offers these two over its own `chunks()`: the socket transport's
(`pool._envd._http1.Response`) and the ones other transports plug in (deploy's httpx responses).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pool._errors import ExecutorError

__all__ = ["BodyReader"]


class BodyReader:
    """`read` and `prefix` over `chunks()`, which a subclass defines; `what` names the exchange in errors."""

    what = "the exchange"

    def chunks(self) -> AsyncIterator[bytes]:
        """The body, chunk by chunk, as it arrives."""
        raise NotImplementedError

    async def read(self, limit: int = 16 << 20) -> bytes:
        """The whole body; ExecutorError past `limit` bytes (envd's JSON answers are small)."""
        body = bytearray()
        async for chunk in self.chunks():
            body += chunk
            if len(body) > limit:
                raise ExecutorError(f"the answer to {self.what} is larger than {limit} bytes")
        return bytes(body)

    async def prefix(self, limit: int) -> bytes:
        """The body's first `limit` bytes (the rest is left unread)."""
        body = bytearray()
        async for chunk in self.chunks():
            body += chunk
            if len(body) >= limit:
                break
        return bytes(body[:limit])
