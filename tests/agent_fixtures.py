"""An executor with its agent server on a free port of this host, and a reader of its SSE streams.

`run_agent_server()` starts `python -m executor` (`executor_fixtures.run_executor`) with `--agent-port` and,
when asked, a given `--agent-state-dir` (so that a second executor finds the first one's sessions).
`read_sse()` reads frames until a predicate holds or a deadline passes, never blocking a test for longer.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.executor_fixtures import run_executor

__all__ = ("AgentServer", "Frame", "read_sse", "run_agent_server")

TOKEN = "agent-test-token"


@dataclass(frozen=True)
class AgentServer:
    url: str
    token: str | None

    def client(self, **headers: str) -> httpx.Client:
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, headers=auth | headers, timeout=30)


@dataclass(frozen=True)
class Frame:
    event: str | None
    id: int | None
    data: Any


@contextlib.contextmanager
def run_agent_server(state_dir: Path | None = None, token: str | None = TOKEN) -> Iterator[AgentServer]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    arguments = ["--agent-port", str(port), *(["--agent-state-dir", str(state_dir)] if state_dir else [])]
    with run_executor(*arguments, access_token=token):
        yield AgentServer(f"http://127.0.0.1:{port}", token)


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
        fields: dict[str, str] = {}
        for line in response.iter_lines():
            if time.monotonic() > deadline:
                break
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if "data" in fields:
                frame = Frame(
                    fields.get("event"), int(fields["id"]) if "id" in fields else None, json.loads(fields["data"])
                )
                frames.append(frame)
                if until(frame):
                    return frames
            fields = {}
    raise AssertionError(f"the stream ended or timed out before the expected frame; got {frames}")
