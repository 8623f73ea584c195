"""JavaScript contexts: one Node.js process per context running the driver script of `_node_driver`.

Why not a Jupyter kernel: the JavaScript kernels on npm (ijavascript, tslab) build the zeromq native module
at install time, which needs a compiler in the template. The driver needs nothing but `node`.

Requests and replies travel on a socketpair (the driver's fd named in its argv), so that what the code
prints cannot be confused with them; the process's own stdout and stderr (where child processes write)
are forwarded to the running execution too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from executor.interpreter._backend import (
    INTERRUPT_GRACE_SECONDS,
    BackendFailed,
    Emit,
    died,
    restart_after,
    unresponsive,
)
from executor.interpreter._wire import Error, Line, NumberOfExecutions, Stderr, Stdout, now, result_from_bundle

__all__ = ("NodeBackend",)


POLL_SECONDS = 0.2
_READ_LIMIT = 64 * 1024 * 1024  # one reply line holds one console.log call, which may be large


class NodeBackend:
    """A context's Node.js process."""

    def __init__(
        self, cwd: str, env: Mapping[str, str], driver: Path, node: str = "node", *, tools: str = "",
        language: str = "javascript",
    ) -> None:  # fmt: skip
        self._cwd = cwd
        self._driver = driver
        self._env = dict(env)
        self._node = node
        self._arguments = (tools, language)  # the driver's: where acorn and sucrase are, and the dialect
        self._process: asyncio.subprocess.Process | None = None
        self._replies: asyncio.StreamReader | None = None
        self._requests: asyncio.StreamWriter | None = None
        self._forwarders: list[asyncio.Task[None]] = []
        self._emit: Emit | None = None  # set while an execution runs: where the process's own output goes

    async def start(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._process = await asyncio.create_subprocess_exec(
                self._node, str(self._driver), str(theirs.fileno()), *self._arguments,
                pass_fds=(theirs.fileno(),), cwd=self._cwd, env=self._env, start_new_session=True,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
        except OSError as exc:
            ours.close()
            raise BackendFailed(f"cannot start node: {exc}") from exc
        finally:
            theirs.close()
        self._replies, self._requests = await asyncio.open_unix_connection(sock=ours, limit=_READ_LIMIT)
        assert self._process.stdout is not None
        assert self._process.stderr is not None
        self._forwarders = [
            asyncio.create_task(self._forward(self._process.stdout, stderr=False)),
            asyncio.create_task(self._forward(self._process.stderr, stderr=True)),
        ]

    async def restart(self) -> None:
        await self.close()
        await self.start()

    async def close(self) -> None:
        if self._requests is not None:
            self._requests.close()
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)  # its own session: children go too
            await self._process.wait()
        for task in self._forwarders:
            task.cancel()
        self._process = self._replies = self._requests = None
        self._forwarders = []

    async def run(self, code: str, env: Mapping[str, str], emit: Emit, stop: asyncio.Event) -> None:
        if self._process is None:  # an earlier restart failed: try again rather than stay broken
            await self.start()
        assert self._requests is not None
        assert self._replies is not None
        assert self._process is not None
        self._requests.write(json.dumps({"code": code, "env": dict(env)}).encode() + b"\n")
        self._emit = emit
        try:
            await self._pump(self._replies, self._process, emit, stop)
        finally:
            self._emit = None

    async def _pump(
        self, replies: asyncio.StreamReader, process: asyncio.subprocess.Process, emit: Emit, stop: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        interrupted_at: float | None = None
        while True:
            if stop.is_set() and interrupted_at is None:
                interrupted_at = loop.time()
                process.send_signal(signal.SIGINT)
            try:
                raw = await asyncio.wait_for(replies.readline(), POLL_SECONDS)
            except TimeoutError:
                if interrupted_at is not None and loop.time() - interrupted_at > INTERRUPT_GRACE_SECONDS:
                    return await restart_after(self, emit, unresponsive("JavaScript process"))
                continue
            if not raw:
                status = await process.wait()
                return await restart_after(self, emit, died("JavaScript process", f"exit status {status}"))
            message = json.loads(raw)
            if message.get("type") == "done":
                return None
            line = _line(message)
            if line is not None:
                emit(line)

    async def _forward(self, stream: asyncio.StreamReader, *, stderr: bool) -> None:
        """Pass what child processes write to the process's stdout/stderr to the running execution."""
        while chunk := await stream.read(65536):
            if self._emit is not None:
                text = chunk.decode(errors="replace")
                self._emit(Stderr(text=text, timestamp=now()) if stderr else Stdout(text=text, timestamp=now()))


def _line(message: dict[str, Any]) -> Line | None:
    match message.get("type"):
        case "count":
            return NumberOfExecutions(execution_count=int(message["count"]))
        case "stdout":
            return Stdout(text=str(message["text"]), timestamp=now())
        case "stderr":
            return Stderr(text=str(message["text"]), timestamp=now())
        case "result":
            return result_from_bundle({"text/plain": str(message["text"])}, is_main_result=True)
        case "error":
            return Error(name=str(message["name"]), value=str(message["value"]), traceback=str(message["traceback"]))
    return None
