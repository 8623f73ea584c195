"""The `process.Process` Connect service (e2b-protocol.md §3.5, §3.7, §3.9).

Start and Connect streams send `start{pid}` first, then output as it is read, then `end`.
Like envd, a Start stream ending does not end its process: a client that disconnects (a background
command, a dropped connection) leaves the process running, reachable through Connect, List and
SendSignal. What ends it is `Connect-Timeout-Ms`: the process is SIGKILLed (its whole group) when
the timeout of the Start call that created it expires, and the stream, if still open, ends with
`deadline_exceeded`. `timeout=0` in the SDK (no header) means no limit.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator

from executor._connect import Call, ClientStream, Rpc, ServerStream, Stream, Unary
from executor._defaults import Defaults
from executor._errors import FailedPrecondition, InvalidArgument
from executor._process_env import environment, working_directory
from executor._processes import Exit, Process, ProcessTable
from executor._spawn import Spec
from executor._users import User, from_authorization
from executor.envd import (
    DataEvent,
    Empty,
    EndEvent,
    ListResponse,
    ProcessConfig,
    ProcessEvent,
    ProcessEventResponse,
    ProcessInfo,
    ProcessInput,
    ProcessSelector,
    Pty,
    SelectorRequest,
    SendInputRequest,
    SendSignalRequest,
    StartEvent,
    StartRequest,
    StreamInputRequest,
    UpdateRequest,
)

__all__ = ("ProcessService",)

KEEPALIVE = ProcessEventResponse(ProcessEvent(keepalive=Empty()))
DEFAULT_PTY_SIZE = (80, 24)
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM, 9: signal.SIGKILL, 15: signal.SIGTERM}


class ProcessService:
    """Runs processes for RPC callers, as the user each call names."""

    def __init__(self, table: ProcessTable, defaults: Defaults, path_env: str) -> None:
        self._table = table
        self._defaults = defaults
        self._path_env = path_env

    def methods(self) -> dict[str, Rpc]:
        return {
            "Start": ServerStream(StartRequest, self.start, KEEPALIVE),
            "Connect": ServerStream(SelectorRequest, self.connect, KEEPALIVE),
            "List": Unary(Empty, self.list),
            "SendInput": Unary(SendInputRequest, self.send_input),
            "StreamInput": ClientStream(StreamInputRequest, self.stream_input),
            "SendSignal": Unary(SendSignalRequest, self.send_signal),
            "CloseStdin": Unary(SelectorRequest, self.close_stdin),
            "Update": Unary(UpdateRequest, self.update),
        }

    async def start(self, request: StartRequest, call: Call, stream: Stream) -> None:
        process = self._table.start(self._spec(request, self._user(call), call.timeout))
        await _follow(process, stream)

    async def connect(self, request: SelectorRequest, call: Call, stream: Stream) -> None:
        self._user(call)
        await _follow(self._find(request.process), stream)

    def list(self, request: Empty, call: Call) -> ListResponse:
        self._user(call)
        return ListResponse([_info(process) for process in self._table])

    async def send_input(self, request: SendInputRequest, call: Call) -> Empty:
        self._user(call)
        await _write(self._find(request.process), request.input)
        return Empty()

    async def stream_input(self, messages: AsyncIterator[StreamInputRequest], call: Call) -> Empty:
        self._user(call)
        process: Process | None = None
        async for message in messages:
            if message.start is not None:
                process = self._find(message.start.process)
            elif message.data is not None:
                if process is None:
                    raise FailedPrecondition("the first StreamInput message must be 'start'")
                await _write(process, message.data.input)
        return Empty()

    def send_signal(self, request: SendSignalRequest, call: Call) -> Empty:
        self._user(call)
        number = SIGNALS.get(request.signal)
        if number is None:
            raise InvalidArgument(f"unsupported signal {request.signal!r}: use SIGNAL_SIGKILL or SIGNAL_SIGTERM")
        self._find(request.process).signal(number)
        return Empty()

    def close_stdin(self, request: SelectorRequest, call: Call) -> Empty:
        self._user(call)
        self._find(request.process).close_stdin()
        return Empty()

    def update(self, request: UpdateRequest, call: Call) -> Empty:
        self._user(call)
        process = self._find(request.process)
        if request.pty is not None and request.pty.size is not None:
            process.resize(request.pty.size.cols, request.pty.size.rows)
        return Empty()

    def _user(self, call: Call) -> User:
        return from_authorization(call.headers.get("authorization"), self._defaults.user)

    def _find(self, selector: ProcessSelector | None) -> Process:
        if selector is None or (selector.pid is None and selector.tag is None):
            raise InvalidArgument("a process selector (pid or tag) is required")
        return self._table.find(selector.pid, selector.tag)

    def _spec(self, request: StartRequest, user: User, timeout: float | None) -> Spec:
        config = request.process
        if config is None or not config.cmd:
            raise InvalidArgument("process.cmd is required")
        return Spec(
            argv=[config.cmd, *config.args],
            env=environment(self._defaults, self._path_env, user, config.envs),
            cwd=working_directory(self._defaults, user, config.cwd),
            user=user,
            stdin=request.stdin is not False,  # absent means true, for clients older than the flag
            pty_size=_pty_size(request.pty),
            tag=request.tag,
            timeout=timeout,
            request_envs=config.envs,
        )


def _pty_size(pty: Pty | None) -> tuple[int, int] | None:
    if pty is None:
        return None
    size = pty.size
    return (size.cols, size.rows) if size is not None and size.cols and size.rows else DEFAULT_PTY_SIZE


async def _follow(process: Process, stream: Stream) -> None:
    """Send `start`, the output, then `end`. Subscribes before its first await: nothing is missed."""
    subscription = process.subscribe()
    try:
        await stream.send(ProcessEventResponse(ProcessEvent(start=StartEvent(process.pid))))
        while True:
            item = await subscription.next()
            if isinstance(item, Exit):
                end = EndEvent(item.exit_code, item.exited, item.status, item.error)
                await stream.send(ProcessEventResponse(ProcessEvent(end=end)))
                return
            await stream.send(ProcessEventResponse(ProcessEvent(data=DataEvent(**{item.stream: item.data}))))
    finally:
        subscription.close()


async def _write(process: Process, data: ProcessInput | None) -> None:
    if data is None or (data.stdin is None and data.pty is None):
        raise InvalidArgument("input (stdin or pty) is required")
    await process.write_input(data.pty if data.pty is not None else data.stdin or b"", to_pty=data.pty is not None)


def _info(process: Process) -> ProcessInfo:
    spec = process.spec
    config = ProcessConfig(cmd=spec.argv[0], args=spec.argv[1:], envs=spec.request_envs, cwd=spec.cwd)
    return ProcessInfo(config, process.pid, spec.tag)
