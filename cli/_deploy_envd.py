"""The sandbox's envd API, reached through the gateway with E2B's routing headers (the single-host recipe).

Only what a deploy needs: upload files (`POST /files`, multipart), read one (`GET /files`), run a command to
its end or start one in the background (`process.Process/Start`, a Connect server stream of JSON envelopes),
find processes by tag (`List`) and signal them (`SendSignal`). Connect and HTTP errors become DeployError.
"""

from __future__ import annotations

import base64
import contextlib
import struct
from collections.abc import Iterator

import httpx
import msgspec

from cli._deploy_errors import DeployError

__all__ = ["ENVD_PORT", "Envd", "sandbox_headers"]

ENVD_PORT = 49983
_END_STREAM = 0x02  # Connect envelope flag: the trailer follows
_RUN_TIMEOUT = httpx.Timeout(30.0, read=300.0)


def sandbox_headers(sandbox_id: str, port: int) -> dict[str, str]:
    """E2B's headers that route a request on the API's host to a port of a sandbox."""
    return {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}


class _Start(msgspec.Struct):
    pid: int = 0


class _End(msgspec.Struct, rename="camel"):
    exit_code: int = 0
    error: str | None = None


class _Event(msgspec.Struct):
    start: _Start | None = None
    data: dict[str, str] | None = None  # stdout / stderr / pty: base64
    end: _End | None = None


class _Message(msgspec.Struct):
    event: _Event | None = None
    error: dict[str, str] | None = None  # the end-of-stream trailer's error


class _Process(msgspec.Struct):
    pid: int
    tag: str | None = None


class _Processes(msgspec.Struct):
    processes: list[_Process] = []


_message = msgspec.json.Decoder(_Message)


class Envd:
    """One sandbox's envd, as `user`, with its access token; every call goes through `client` (the API's URL)."""

    def __init__(self, client: httpx.Client, sandbox_id: str, access_token: str | None, *, user: str) -> None:
        self._client = client
        self._user = user
        self._headers = sandbox_headers(sandbox_id, ENVD_PORT)
        if access_token:
            self._headers["X-Access-Token"] = access_token
        self._auth = "Basic " + base64.b64encode(f"{user}:".encode()).decode()

    def upload(self, files: dict[str, bytes]) -> None:
        """Write each absolute path's content (parents created, owned by the user), in one request."""
        parts = [("file", (path, content, "application/octet-stream")) for path, content in files.items()]
        response = self._client.post(
            "/files", params={"username": self._user}, files=parts, headers=self._headers, timeout=_RUN_TIMEOUT
        )
        _check(response, "upload files")

    def read(self, path: str) -> bytes | None:
        """A file's content, or None when it does not exist."""
        response = self._client.get("/files", params={"path": path, "username": self._user}, headers=self._headers)
        if response.status_code == 404:
            return None
        _check(response, f"read {path}")
        return response.content

    def run(self, command: str) -> tuple[int, str]:
        """Run `bash -l -c command` to its end: its exit code and its output (stdout then stderr)."""
        out: list[bytes] = []
        with self._start(command, tag=None, envs={}) as events:
            for message, raw in events:
                if message.event and message.event.end:
                    return message.event.end.exit_code, b"".join(out).decode(errors="replace")
                out.append(raw)
        raise DeployError(f"the sandbox's envd ended the command {command[:60]!r} without its exit code")

    def start(self, command: str, *, tag: str, envs: dict[str, str]) -> int:
        """Start `bash -l -c command` in the background (its stream is closed, it lives on); its pid."""
        with self._start(command, tag=tag, envs=envs) as events:
            for message, _ in events:
                if message.event and message.event.start:
                    return message.event.start.pid
        raise DeployError(f"the sandbox's envd did not start {command[:60]!r}")

    def _start(self, command: str, *, tag: str | None, envs: dict[str, str]) -> _Stream:
        request = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command], "envs": envs}, "stdin": False}
        if tag:
            request["tag"] = tag
        body = msgspec.json.encode(request)
        headers = self._headers | {
            "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1", "Authorization": self._auth,
        }  # fmt: skip
        return _Stream(self._client, struct.pack(">BI", 0, len(body)) + body, headers)

    def tagged(self, tag: str) -> list[int]:
        """Pids of the running processes started with `tag`."""
        response = self._unary("process.Process/List", {})
        return [p.pid for p in msgspec.json.decode(response, type=_Processes).processes if p.tag == tag]

    def signal(self, tag: str, signal: str) -> None:
        """Send SIGTERM or SIGKILL (`signal`) to the process group started with `tag`; nothing when none runs."""
        with contextlib.suppress(_NotFound):
            self._unary("process.Process/SendSignal", {"process": {"tag": tag}, "signal": f"SIGNAL_{signal}"})

    def _unary(self, method: str, request: dict[str, object]) -> bytes:
        headers = self._headers | {"Content-Type": "application/json", "Authorization": self._auth}
        response = self._client.post(f"/{method}", content=msgspec.json.encode(request), headers=headers)
        if response.status_code == 404 and b"not_found" in response.content:
            raise _NotFound
        _check(response, method)
        return response.content


class _NotFound(Exception):
    """The Connect error `not_found`: no process matched the selector."""


class _Stream:
    """A Connect server stream as a context manager that yields (message, its output bytes) pairs."""

    def __init__(self, client: httpx.Client, body: bytes, headers: dict[str, str]) -> None:
        self._request = client.build_request(
            "POST", "/process.Process/Start", content=body, headers=headers, timeout=_RUN_TIMEOUT
        )
        self._client = client
        self._response: httpx.Response | None = None

    def __enter__(self) -> Iterator[tuple[_Message, bytes]]:
        """Messages with the output each carries; the trailer's error raises DeployError."""
        response = self._client.send(self._request, stream=True)
        if response.status_code != 200:
            response.read()
            response.close()
            _check(response, "start a process")
        self._response = response
        return _envelopes(response)

    def __exit__(self, *_: object) -> None:
        if self._response is not None:
            self._response.close()


def _envelopes(response: httpx.Response) -> Iterator[tuple[_Message, bytes]]:
    buffer = b""
    for chunk in response.iter_bytes():
        buffer += chunk
        while len(buffer) >= 5 and len(buffer) >= 5 + (size := struct.unpack(">I", buffer[1:5])[0]):
            flags, payload, buffer = buffer[0], buffer[5 : 5 + size], buffer[5 + size :]
            message = _message.decode(payload)
            if flags & _END_STREAM:
                if message.error:
                    raise DeployError(f"the sandbox's envd failed: {message.error.get('message', message.error)}")
                return
            data = message.event.data if message.event and message.event.data else {}
            yield message, b"".join(base64.b64decode(value) for value in data.values())


def _check(response: httpx.Response, what: str) -> None:
    if response.is_success:
        return
    try:
        message = msgspec.json.decode(response.content).get("message") or response.text
    except (msgspec.DecodeError, AttributeError):
        message = response.text
    raise DeployError(f"the sandbox refused to {what}: {response.status_code} {str(message)[:300]}")
