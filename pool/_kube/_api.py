"""A small async client for the Kubernetes API over httpx, its errors re-raised as pool errors.

The typed Kubernetes clients are not usable under mypy --strict (`kubernetes_asyncio` has no annotations),
and the synchronous `kubernetes` client fails to decode the Status a 1.20 apiserver answers to a Binding;
the runtime (and the dev cluster's stand-in kubelet, `kube_dev`) make a handful of calls, each a few
lines of plain HTTP.

    RuntimeFailure          (pool) the apiserver could not be reached
    └── KubeApiError        the apiserver answered with an error status (`status`: 404, 409, 410, ...)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx
import msgspec

from pool._errors import RuntimeFailure
from pool._kube._connection import Connection, TokenFileAuth

__all__ = ["KubeApi", "KubeApiError"]


class KubeApiError(RuntimeFailure):
    """The apiserver refused a request."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"Kubernetes API: {status} {reason}: {message}")
        self.status = status


class _Status(msgspec.Struct, kw_only=True):
    reason: str = ""
    message: str = ""


class KubeApi:
    """One apiserver: JSON bodies in, raw JSON out; every failure a `RuntimeFailure`."""

    def __init__(self, connection: Connection, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {connection.token}"} if connection.token else {}
        self._http = httpx.AsyncClient(
            base_url=connection.server,
            headers=headers,
            auth=TokenFileAuth(connection.token_file) if connection.token_file else None,
            verify=connection.verify,
            timeout=httpx.Timeout(30.0, connect=5.0),
            trust_env=False,  # the API address is configured, never taken from a proxy variable
            transport=transport,
        )
        self.server = connection.server

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> bytes:
        """One request; the response body."""
        content = msgspec.json.encode(body) if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        try:
            response = await self._http.request(method, path, content=content, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise RuntimeFailure(f"cannot reach the Kubernetes API at {self.server}: {exc!r}") from exc
        if response.status_code >= 400:
            raise _error(response.status_code, response.content)
        return response.content

    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[bytes]:
        """The lines of a watch stream (one JSON event each) until the server ends it."""
        query = {**params, "watch": "1", "allowWatchBookmarks": "true"}
        try:
            async with self._http.stream("GET", path, params=query, timeout=httpx.Timeout(None, connect=5.0)) as r:
                if r.status_code >= 400:
                    raise _error(r.status_code, await r.aread())
                async for line in r.aiter_lines():
                    if line:
                        yield line.encode()
        except httpx.HTTPError as exc:
            raise RuntimeFailure(f"the watch on {path} failed: {exc!r}") from exc


def _error(status: int, content: bytes) -> KubeApiError:
    try:
        parsed = msgspec.json.decode(content, type=_Status)
    except msgspec.DecodeError:
        parsed = _Status(message=content[:200].decode(errors="replace"))
    return KubeApiError(status, parsed.reason, parsed.message)
