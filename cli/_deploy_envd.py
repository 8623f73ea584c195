"""The sandbox's envd API as a deploy uses it: `pool.EnvdClient` through the gateway, with E2B's routing headers.

Only what a deploy needs: upload files (`POST /files`, multipart), read one (`GET /files`), run a command to its
end or start one in the background (`process.Process/Start`), find processes by tag (`List`) and signal them
(`SendSignal`). The client's errors become DeployError.

Why this shape: the client is async and its transport a seam, while a deploy is a short sequential command-line
run. So the messages, headers and framing stay the client's (one definition for every caller) and only the
transport is deploy's own, an `httpx.AsyncClient` on the API's URL (`_GatewayTransport`); the calls run on one
event loop this object keeps for its lifetime (`asyncio.Runner`), which keeps the AsyncClient's connections
usable from one call to the next, and the rest of the deploy stays plain synchronous code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

import httpx

from cli._deploy_errors import DeployError
from executor.envd import DataEvent, ProcessSelector, SendSignalRequest
from pool import ENVD_PORT, BodyReader, EnvdClient, ExecutorError, ExecutorRefused, shell_command

__all__ = ["Envd", "sandbox_headers"]

T = TypeVar("T")
_RUN_TIMEOUT = httpx.Timeout(30.0, read=300.0)


def sandbox_headers(sandbox_id: str, port: int) -> dict[str, str]:
    """E2B's headers that route a request on the API's host to a port of a sandbox."""
    return {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}


class _Reply(BodyReader):
    """An httpx streaming response as the client reads one."""

    what = "a request to the sandbox's envd"

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers: Mapping[str, str] = response.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.aiter_bytes():
            yield chunk


class _GatewayTransport:
    """envd's requests sent to the gateway with the routing headers of one sandbox's envd port."""

    def __init__(self, client: httpx.AsyncClient, sandbox_id: str) -> None:
        self._client = client
        self._routing = sandbox_headers(sandbox_id, ENVD_PORT)

    @asynccontextmanager
    async def exchange(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes
    ) -> AsyncIterator[_Reply]:
        request = self._client.build_request(method, target, headers={**self._routing, **headers}, content=body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise ExecutorError(f"{method} {target.split('?', 1)[0]} through {self._client.base_url}: {exc!r}") from exc
        try:
            yield _Reply(response)
        except httpx.HTTPError as exc:
            raise ExecutorError(f"reading the answer to {method} {target.split('?', 1)[0]}: {exc!r}") from exc
        finally:
            await response.aclose()


class Envd:
    """One sandbox's envd, as `user`, with its access token, through the API at `api_url`; a context manager
    (its event loop and connections close with the block)."""

    def __init__(self, api_url: httpx.URL, sandbox_id: str, access_token: str | None, *, user: str) -> None:
        self._runner = asyncio.Runner()
        self._http = httpx.AsyncClient(base_url=api_url, timeout=_RUN_TIMEOUT)
        self._client = EnvdClient(_GatewayTransport(self._http, sandbox_id), user=user, token=access_token)

    def upload(self, files: dict[str, bytes]) -> None:
        """Write each absolute path's content (parents created, owned by the user), in one request."""
        self._call("upload files", self._client.write_files(files))

    def read(self, path: str) -> bytes | None:
        """A file's content, or None when it does not exist."""

        async def read() -> bytes | None:
            try:
                async with self._client.read_file(path) as reply:
                    return await reply.read()
            except ExecutorRefused as exc:
                if exc.code == 404:
                    return None
                raise

        return self._call(f"read {path}", read())

    def run(self, command: str) -> tuple[int, str]:
        """Run `bash -l -c command` to its end: its exit code and its output (stdout and stderr as they came)."""
        out: list[bytes] = []

        def output(data: DataEvent) -> None:
            out.extend(chunk for chunk in (data.stdout, data.stderr, data.pty) if chunk)

        end = self._call(f"run {command[:60]!r}", self._client.run(shell_command(command), output))
        return end.exit_code, b"".join(out).decode(errors="replace")

    def start(self, command: str, *, tag: str, envs: dict[str, str]) -> int:
        """Start `bash -l -c command` in the background (its stream is closed, it lives on); its pid."""
        request = shell_command(command, envs=envs, tag=tag)
        return self._call(f"start {command[:60]!r}", self._client.start_background(request))

    def tagged(self, tag: str) -> list[int]:
        """Pids of the running processes started with `tag`."""
        return [p.pid for p in self._call("list processes", self._client.list_processes()) if p.tag == tag]

    def signal(self, tag: str, signal: str) -> None:
        """Send SIGTERM or SIGKILL (`signal`) to the process group started with `tag`; nothing when none runs."""

        async def send() -> None:
            try:
                await self._client.send_signal(SendSignalRequest(ProcessSelector(tag=tag), f"SIGNAL_{signal}"))
            except ExecutorRefused as exc:
                if exc.code != "not_found":  # no process matched the selector
                    raise

        self._call(f"signal {tag}", send())

    def _call(self, what: str, call: Coroutine[Any, Any, T]) -> T:
        """Run one call of the client on this object's event loop; its errors as DeployError."""
        try:
            return self._runner.run(call)
        except ExecutorRefused as exc:
            raise DeployError(f"the sandbox refused to {what}: {exc.code} {exc.message[:300]}") from exc
        except ExecutorError as exc:
            raise DeployError(f"the sandbox's envd failed to {what}: {exc}") from exc

    def __enter__(self) -> Envd:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._runner.run(self._http.aclose())
        finally:
            self._runner.close()
