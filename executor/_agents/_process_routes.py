"""`/v1/processes/*`: sandbox-agent's process API over the executor's own process table.

    GET|POST /v1/processes/config               the limits below (POST changes them, within the hard caps)
    POST     /v1/processes/run                  run to the end → {exitCode, timedOut, stdout, stderr, ...}
    POST     /v1/processes                      start one → ProcessInfo (`proc_<n>`); GET lists them (?owner)
    GET|DELETE /v1/processes/{id}               ProcessInfo / 204 (a running one is killed first)
    POST     /v1/processes/{id}/stop|kill       SIGTERM | SIGKILL, waiting up to ?waitMs → ProcessInfo
    GET      /v1/processes/{id}/logs            {processId, stream, entries: [{sequence, stream, timestampMs, data,
                                                encoding: "base64"}]}; ?follow=true with Accept: text/event-stream → SSE
    POST     /v1/processes/{id}/input           {data, encoding: base64 (default) | utf8} → {bytesWritten}
    POST     /v1/processes/{id}/terminal/resize {cols, rows}; 409 once the process has exited
    GET      /v1/processes/{id}/terminal/ws     the terminal over a WebSocket (`_terminal`)

The processes are the executor's (`ProcessTable`): envd's `commands.list()` sees them too, and they end
with the sandbox; the last `MAX_EXITED` that exited are kept for GET and logs. Each keeps at most
`maxLogBytesPerProcess` of output (the oldest goes first; sequence
numbers never repeat). Commands run as the sandbox's default user with envd's environment.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import signal
import time
from collections import deque

import msgspec

from executor._agents._http import HEARTBEAT_SECONDS, ApiError, accepts, count, read_json, send_json, start_sse
from executor._defaults import Defaults
from executor._exchange import Request, Response
from executor._process_env import environment, working_directory
from executor._processes import Exit, Output, Process, ProcessTable, Subscription
from executor._spawn import Spec
from executor._users import lookup

__all__ = ("ProcessRoutes",)

HARD_MAX_PROCESSES = 256
HARD_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
HARD_MAX_RUN_MS = 3_600_000
MAX_EXITED = 64
"""Exited processes kept (info and output) for GET and logs; past it the oldest is forgotten, as a DELETE would."""
ENTRY_OVERHEAD_BYTES = 128
"""What one output entry costs beside its data, counted against the log limit (a byte-at-a-time writer)."""


class ProcessConfig(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    max_concurrent_processes: int = 64
    default_run_timeout_ms: int = 30_000
    max_run_timeout_ms: int = 300_000
    max_output_bytes: int = 1_048_576
    max_log_bytes_per_process: int = 10_485_760
    max_input_bytes_per_request: int = 65_536


class RunRequest(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    command: str
    args: list[str] = []
    cwd: str | None = None
    env: dict[str, str] = {}
    timeout_ms: int | None = None
    max_output_bytes: int | None = None


class CreateRequest(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    command: str
    args: list[str] = []
    cwd: str | None = None
    env: dict[str, str] = {}
    interactive: bool = False
    tty: bool = False


class InputRequest(msgspec.Struct, forbid_unknown_fields=True):
    data: str
    encoding: str | None = None


class ResizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    cols: int
    rows: int


class ProcessInfo(msgspec.Struct, rename="camel"):
    id: str
    command: str
    args: list[str]
    tty: bool
    interactive: bool
    owner: str
    status: str
    pid: int | None
    created_at_ms: int
    cwd: str | None = None
    exit_code: int | None = None
    exited_at_ms: int | None = None


class Tracked:
    """A process started here: its info and its output log."""

    def __init__(self, info: ProcessInfo, process: Process, log_limit: int) -> None:
        self.info = info
        self.process = process
        self.entries: deque[tuple[int, str, int, bytes]] = deque()  # (sequence, stream, timestampMs, data)
        self._bytes = 0
        self._limit = log_limit
        self._sequence = 0
        self._waiters: list[asyncio.Future[None]] = []  # one per follower: each is woken, none can miss it
        self.done = asyncio.Event()
        self.collector: asyncio.Task[None] | None = None  # held here: the loop keeps only weak references to tasks

    @property
    def last_sequence(self) -> int:
        """The sequence number of the latest output (0 before any)."""
        return self._sequence

    def add(self, stream: str, data: bytes) -> None:
        self._sequence += 1
        self.entries.append((self._sequence, stream, int(time.time() * 1000), data))
        self._bytes += len(data) + ENTRY_OVERHEAD_BYTES
        while self._bytes > self._limit and len(self.entries) > 1:
            self._bytes -= len(self.entries.popleft()[3]) + ENTRY_OVERHEAD_BYTES
        self._wake()

    def finish(self, end: Exit) -> None:
        self.info.status, self.info.exit_code = "exited", end.exit_code
        self.info.exited_at_ms = int(time.time() * 1000)
        self.done.set()
        self._wake()

    async def wait(self, after: int, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Until there is output after sequence `after` or the process has exited; TimeoutError past `timeout`."""
        if self._sequence > after or self.done.is_set():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class ProcessRoutes:
    def __init__(self, defaults: Defaults, table: ProcessTable, path_env: str) -> None:
        self._defaults = defaults
        self._table = table
        self._path_env = path_env
        self._config = ProcessConfig()
        self._tracked: dict[str, Tracked] = {}
        self._next = 0

    def _spec(
        self, command: str, args: list[str], cwd: str | None, env: dict[str, str], stdin: bool, tty: bool
    ) -> Spec:
        user = lookup(self._defaults.user)
        return Spec(
            argv=[command, *args],
            env=environment(self._defaults, self._path_env, user, env),
            cwd=working_directory(self._defaults, user, cwd),
            user=user,
            stdin=stdin,
            pty_size=(80, 24) if tty else None,
        )

    async def get_config(self, request: Request, response: Response) -> None:
        await send_json(response, 200, self._config)

    async def set_config(self, request: Request, response: Response) -> None:
        config = await read_json(request, ProcessConfig)
        caps = (
            (config.max_concurrent_processes, HARD_MAX_PROCESSES, "maxConcurrentProcesses"),
            (config.max_output_bytes, HARD_MAX_OUTPUT_BYTES, "maxOutputBytes"),
            (config.max_log_bytes_per_process, HARD_MAX_OUTPUT_BYTES, "maxLogBytesPerProcess"),
            (config.max_run_timeout_ms, HARD_MAX_RUN_MS, "maxRunTimeoutMs"),
            (config.default_run_timeout_ms, config.max_run_timeout_ms, "defaultRunTimeoutMs"),
            (config.max_input_bytes_per_request, HARD_MAX_OUTPUT_BYTES, "maxInputBytesPerRequest"),
        )
        for value, cap, name in caps:
            if not 1 <= value <= cap:
                raise ApiError("invalid_request", 400, f"{name} must be between 1 and {cap}")
        self._config = config
        await send_json(response, 200, config)

    async def run(self, request: Request, response: Response) -> None:
        body = await read_json(request, RunRequest)
        timeout_ms = body.timeout_ms or self._config.default_run_timeout_ms
        if not 1 <= timeout_ms <= self._config.max_run_timeout_ms:
            raise ApiError("invalid_request", 400, f"timeoutMs must be between 1 and {self._config.max_run_timeout_ms}")
        limit = min(body.max_output_bytes or self._config.max_output_bytes, self._config.max_output_bytes)
        started = time.monotonic()
        process = self._table.start(self._spec(body.command, body.args, body.cwd, body.env, False, False))
        subscription = process.subscribe()
        outputs = {"stdout": bytearray(), "stderr": bytearray()}
        truncated = {"stdout": False, "stderr": False}
        timed_out = False
        end: Exit | None = None
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                while end is None:
                    item = await subscription.next()
                    if isinstance(item, Exit):
                        end = item
                    else:
                        _append(outputs, truncated, item, limit)
        except TimeoutError:
            timed_out = True
            process.signal(signal.SIGKILL)
        finally:
            subscription.close()
        stdout, stderr = (outputs[name].decode("utf-8", "replace") for name in ("stdout", "stderr"))
        await send_json(response, 200, {
            "exitCode": None if end is None else end.exit_code, "timedOut": timed_out, "stdout": stdout,
            "stderr": stderr, "stdoutTruncated": truncated["stdout"], "stderrTruncated": truncated["stderr"],
            "durationMs": int((time.monotonic() - started) * 1000),
        })  # fmt: skip

    async def create(self, request: Request, response: Response) -> None:
        body = await read_json(request, CreateRequest)
        if (
            sum(1 for t in self._tracked.values() if t.info.status == "running")
            >= self._config.max_concurrent_processes
        ):
            raise ApiError("conflict", 409, f"at most {self._config.max_concurrent_processes} processes run at once")
        spec = self._spec(body.command, body.args, body.cwd, body.env, body.interactive or body.tty, body.tty)
        process = self._table.start(spec)
        self._next += 1
        info = ProcessInfo(
            f"proc_{self._next}", body.command, body.args, body.tty, body.interactive, "user", "running",
            process.pid, int(time.time() * 1000), spec.cwd,
        )  # fmt: skip
        tracked = Tracked(info, process, self._config.max_log_bytes_per_process)
        self._tracked[info.id] = tracked
        self._forget_exited()
        subscription = process.subscribe()
        tracked.collector = asyncio.get_running_loop().create_task(_collect(tracked, subscription))
        await send_json(response, 200, info)

    async def list_processes(self, request: Request, response: Response) -> None:
        owner = request.query.get("owner")
        found = [t.info for t in self._tracked.values() if owner in (None, "", t.info.owner)]
        await send_json(response, 200, {"processes": found})

    def _forget_exited(self) -> None:
        exited = [process_id for process_id, tracked in self._tracked.items() if tracked.done.is_set()]
        for process_id in exited[: max(0, len(exited) - MAX_EXITED)]:  # oldest first: dicts keep their order
            del self._tracked[process_id]

    def find(self, process_id: str) -> Tracked:
        tracked = self._tracked.get(process_id)
        if tracked is None:
            raise ApiError("not_found", 404, f"process not found: {process_id}")
        return tracked

    async def get(self, request: Request, response: Response, process_id: str) -> None:
        await send_json(response, 200, self.find(process_id).info)

    async def delete(self, request: Request, response: Response, process_id: str) -> None:
        tracked = self.find(process_id)
        if tracked.info.status == "running":
            tracked.process.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tracked.done.wait(), 2)
        self._tracked.pop(process_id, None)  # a second DELETE that waited too finds it gone
        await response.send(204)

    async def stop(self, request: Request, response: Response, process_id: str) -> None:
        await self._signal(request, response, process_id, signal.SIGTERM)

    async def kill(self, request: Request, response: Response, process_id: str) -> None:
        await self._signal(request, response, process_id, signal.SIGKILL)

    async def _signal(self, request: Request, response: Response, process_id: str, number: int) -> None:
        tracked = self.find(process_id)
        if tracked.info.status == "running":
            tracked.process.signal(number)
            wait_ms = count(request.query.get("waitMs"))
            if wait_ms:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(tracked.done.wait(), min(wait_ms, 60_000) / 1000)
        await send_json(response, 200, tracked.info)

    async def logs(self, request: Request, response: Response, process_id: str) -> None:
        tracked = self.find(process_id)
        stream = request.query.get("stream", "combined")
        if stream not in ("stdout", "stderr", "combined", "pty"):
            raise ApiError("invalid_request", 400, "stream must be stdout, stderr, combined or pty")
        since = count(request.query.get("since")) or 0
        horizon = max(since, tracked.last_sequence)  # what a followed stream has seen, or left out, once this is sent
        selected = [e for e in tracked.entries if e[0] > since and stream in ("combined", e[1])]
        tail = count(request.query.get("tail"))
        if tail is not None:
            selected = selected[-tail:] if tail else []
        follow = request.query.get("follow", "").lower() in ("1", "true")
        if (
            follow
            and accepts(request, "text/event-stream")
            and "text/event-stream" in request.headers.get("accept", "")
        ):
            await self._follow(response, tracked, stream, selected, horizon)
            return
        await send_json(
            response, 200, {"processId": process_id, "stream": stream, "entries": [_entry(e) for e in selected]}
        )

    async def _follow(
        self,
        response: Response,
        tracked: Tracked,
        stream: str,
        backlog: list[tuple[int, str, int, bytes]],
        horizon: int,
    ) -> None:
        """The backlog, then every entry after `horizon` (not what `since` or `tail` left out) until the exit."""
        await start_sse(response)
        for entry in backlog:
            await response.write(_frame(entry))
        seen = horizon
        while True:
            upto = tracked.last_sequence
            for entry in [e for e in tracked.entries if seen < e[0] <= upto and stream in ("combined", e[1])]:
                await response.write(_frame(entry))
            seen = upto
            if tracked.done.is_set() and tracked.last_sequence == seen:
                break
            try:
                await tracked.wait(seen, HEARTBEAT_SECONDS)
            except TimeoutError:
                await response.write(b": heartbeat\n\n")
        await response.end()

    async def input(self, request: Request, response: Response, process_id: str) -> None:
        tracked = self.find(process_id)
        body = await read_json(request, InputRequest)
        if body.encoding in (None, "base64"):
            try:
                data = base64.b64decode(body.data, validate=True)
            except binascii.Error as exc:
                raise ApiError("invalid_request", 400, "invalid base64 input") from exc
        elif body.encoding in ("utf8", "utf-8", "text"):
            data = body.data.encode()
        else:
            raise ApiError("invalid_request", 400, f"unknown encoding {body.encoding!r}: base64 or utf8")
        if len(data) > self._config.max_input_bytes_per_request:
            raise ApiError(
                "payload_too_large", 413, f"input is larger than {self._config.max_input_bytes_per_request} bytes"
            )
        if tracked.info.status != "running":
            raise ApiError("conflict", 409, f"process {process_id} has exited")
        await tracked.process.write_input(data, to_pty=tracked.process.has_pty)
        await send_json(response, 200, {"bytesWritten": len(data)})

    async def resize(self, request: Request, response: Response, process_id: str) -> None:
        tracked = self.find(process_id)
        body = await read_json(request, ResizeRequest)
        if tracked.info.status != "running" or not tracked.process.has_pty:
            raise ApiError("conflict", 409, "PTY resize handle unavailable")
        tracked.process.resize(body.cols, body.rows)
        await send_json(response, 200, {"cols": body.cols, "rows": body.rows})

    async def terminal(self, request: Request, response: Response, process_id: str) -> None:
        from executor._agents._terminal import serve_terminal

        await serve_terminal(request, response, self.find(process_id))


def _append(outputs: dict[str, bytearray], truncated: dict[str, bool], item: Output, limit: int) -> None:
    name = "stderr" if item.stream == "stderr" else "stdout"
    room = limit - len(outputs[name])
    if len(item.data) > room:
        truncated[name] = True
    outputs[name] += item.data[: max(room, 0)]


async def _collect(tracked: Tracked, subscription: Subscription) -> None:
    while True:
        item = await subscription.next()
        if isinstance(item, Exit):
            subscription.close()
            tracked.finish(item)
            return
        tracked.add(item.stream, item.data)


def _entry(entry: tuple[int, str, int, bytes]) -> dict[str, object]:
    sequence, stream, stamp, data = entry
    return {
        "sequence": sequence,
        "stream": stream,
        "timestampMs": stamp,
        "data": base64.b64encode(data).decode(),
        "encoding": "base64",
    }


def _frame(entry: tuple[int, str, int, bytes]) -> bytes:
    return b"event: log\nid: %d\ndata: %b\n\n" % (entry[0], msgspec.json.encode(_entry(entry)))
