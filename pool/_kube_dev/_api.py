"""A small async client for the Kubernetes API over httpx: requests, errors and watch streams.

The official clients were tried first: `kubernetes_asyncio`'s generated methods carry no annotations
(every call is an error under mypy --strict), and the synchronous `kubernetes` client fails to decode the
Status a 1.20 apiserver answers to a Binding. Raw HTTP is a few lines for the calls a kubelet makes.

    ApiError        the apiserver answered with an error status (`status`, `reason`, `message`)
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import msgspec

__all__ = ["ApiError", "KubeClient"]


class ApiError(Exception):
    """The apiserver refused a request; `status` is the HTTP status (404, 409, 410, ...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class _Status(msgspec.Struct, kw_only=True):
    reason: str = ""
    message: str = ""
    code: int = 0


class KubeClient:
    """Bearer-token client for one apiserver; JSON bodies in, `httpx.Response` out, errors as `ApiError`."""

    def __init__(
        self, server: str, token: str, ca_file: Path, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=server,
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=ca_file),
            timeout=httpx.Timeout(30.0, connect=5.0),
            trust_env=False,  # a proxy from the environment must never see loopback API calls
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> httpx.Response:
        content = msgspec.json.encode(body) if body is not None else None
        headers = {"Content-Type": content_type} if content is not None else {}
        response = await self._http.request(method, path, content=content, params=params, headers=headers)
        if response.status_code >= 400:
            raise _error(response.status_code, response.content)
        return response

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """`request` decoded to plain Python objects."""
        return msgspec.json.decode((await self.request(method, path, **kwargs)).content)

    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[bytes]:
        """The raw lines of a watch stream (one JSON event each) until the server ends it."""
        query = {**params, "watch": "1"}
        timeout = httpx.Timeout(None, connect=5.0)
        async with self._http.stream("GET", path, params=query, timeout=timeout) as response:
            if response.status_code >= 400:
                raise _error(response.status_code, await response.aread())
            async for line in response.aiter_lines():
                if line:
                    yield line.encode()


def _error(status: int, content: bytes) -> ApiError:
    try:
        parsed = msgspec.json.decode(content, type=_Status)
    except msgspec.DecodeError:
        parsed = _Status(message=content[:200].decode(errors="replace"))
    return ApiError(status, parsed.reason, parsed.message)
