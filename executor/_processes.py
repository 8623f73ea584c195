"""The process table: start processes as a user, fan their output out, feed their input, signal them.

Each process runs in its own process group (its own session when it has a PTY), so signals reach
the whole tree it started. Output is read from non-blocking fds in the event loop and handed to
every current `Subscription` (the Start stream and any Connect streams); with no subscriber it is
dropped, as in envd. When a subscriber falls behind by `HIGH_WATER` chunks, reading stops until it
catches up, so the writing process blocks instead of the executor buffering without bound.

Exit comes from the `Reaper`. The pipes are then drained of what the process wrote and closed,
even if a grandchild still holds them open (its later output is lost, as in envd), and every
subscriber gets the `Exit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from executor._errors import FailedPrecondition, NotFound, os_errors
from executor._reaper import Reaper
from executor._spawn import Child, Spec, set_window_size, spawn

__all__ = ("Exit", "Output", "Process", "ProcessTable", "Subscription")

READ_SIZE = 32 * 1024
HIGH_WATER = 64
LOW_WATER = 16


@dataclass(frozen=True)
class Output:
    """A chunk of output; `stream` is "stdout", "stderr" or "pty"."""

    stream: str
    data: bytes


@dataclass(frozen=True)
class Exit:
    """How a process ended, in envd's terms ("exit status 1", "signal: killed", code -1)."""

    exit_code: int
    exited: bool
    status: str
    error: str | None

    @classmethod
    def from_wait_status(cls, status: int) -> Exit:
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            name = signal.strsignal(number) or f"signal {number}"
            text = f"signal: {name[:1].lower()}{name[1:]}" + (" (core dumped)" if os.WCOREDUMP(status) else "")
            return cls(-1, False, text, text)
        code = os.waitstatus_to_exitcode(status)
        text = f"exit status {code}"
        return cls(code, True, text, text if code else None)


class Subscription:
    """One reader of a process's events, in order: Output chunks, then one Exit."""

    def __init__(self, process: Process) -> None:
        self._process = process
        self._items: deque[Output | Exit] = deque()
        self._ready = asyncio.Event()

    @property
    def backlog(self) -> int:
        return len(self._items)

    def push(self, item: Output | Exit) -> None:
        self._items.append(item)
        self._ready.set()

    async def next(self) -> Output | Exit:
        """The next event; waits for one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        self._process.consumed()
        return item

    def close(self) -> None:
        """Stop receiving; the process goes on."""
        self._process.unsubscribe(self)


class Process:
    """A started process and its pipes or PTY."""

    def __init__(self, child: Child, on_done: Callable[[Process], None]) -> None:
        self.pid = child.popen.pid
        self.spec = child.spec
        self._child = child
        self._on_done = on_done
        self._outputs = dict(child.outputs)  # open output fd -> stream name
        self._subscriptions: set[Subscription] = set()
        self._paused = False
        self._input_lock = asyncio.Lock()  # one writer at a time, so inputs do not interleave
        self._input_room: asyncio.Future[None] | None = None  # resolved when the input fd is writable
        self._loop = asyncio.get_running_loop()
        self._kill_timer: asyncio.TimerHandle | None = None
        if child.spec.timeout is not None:
            self._kill_timer = self._loop.call_later(child.spec.timeout, self.signal, signal.SIGKILL)
        self._watch_outputs()

    @property
    def has_pty(self) -> bool:
        return self._child.pty_fd is not None

    def subscribe(self) -> Subscription:
        subscription = Subscription(self)
        self._subscriptions.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)
        self.consumed()

    def consumed(self) -> None:
        """A subscriber took an event: resume reading once nobody is far behind."""
        if self._paused and all(s.backlog <= LOW_WATER for s in self._subscriptions):
            self._paused = False
            self._watch_outputs()

    async def write_input(self, data: bytes, to_pty: bool) -> None:
        """Write to stdin or to the PTY, waiting while the pipe is full."""
        if to_pty != self.has_pty:
            where = "the pty, not the stdin" if self.has_pty else "the stdin, not the pty"
            raise FailedPrecondition(f"input for process {self.pid} must be written to {where}")
        async with self._input_lock:
            view = memoryview(data)
            while view:
                fd = self._child.input_fd
                if fd is None:
                    raise FailedPrecondition(f"stdin of process {self.pid} is not enabled or closed")
                with os_errors(f"error writing input of process {self.pid}"):
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        await self._writable(fd)

    def close_stdin(self) -> None:
        if self.has_pty:
            raise FailedPrecondition("cannot close stdin of a PTY process: send Ctrl+D (0x04) instead")
        self._close_input()

    def resize(self, cols: int, rows: int) -> None:
        if self._child.pty_fd is None:
            raise FailedPrecondition(f"process {self.pid} has no PTY to resize")
        set_window_size(self._child.pty_fd, cols, rows)

    def signal(self, number: int) -> None:
        """Signal the process group (the process alone if it left its group)."""
        with contextlib.suppress(ProcessLookupError):
            try:
                os.killpg(self.pid, number)
            except ProcessLookupError:
                os.kill(self.pid, number)

    def on_exit(self, wait_status: int) -> None:
        """Called by the Reaper: drain the output, close everything, tell the subscribers."""
        self._child.popen.returncode = os.waitstatus_to_exitcode(wait_status)  # so Popen never waits
        for fd in list(self._outputs):
            self._drain(fd)
        self._close_input()
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        end = Exit.from_wait_status(wait_status)
        for subscription in self._subscriptions:
            subscription.push(end)
        self._on_done(self)

    def _watch_outputs(self) -> None:
        for fd in self._outputs:
            self._loop.add_reader(fd, self._read, fd)

    def _read(self, fd: int) -> bool:
        """Read one chunk and publish it; False when there is nothing more to read right now."""
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return False
        except OSError:  # EIO: the PTY's other side is closed
            data = b""
        if not data:
            self._close_output(fd)
            return False
        self._publish(Output(self._outputs[fd], data))
        return True

    def _publish(self, item: Output) -> None:
        for subscription in self._subscriptions:
            subscription.push(item)
            if subscription.backlog > HIGH_WATER and not self._paused:
                self._paused = True
                for fd in self._outputs:
                    self._loop.remove_reader(fd)

    def _drain(self, fd: int) -> None:
        while self._read(fd):
            pass
        if fd in self._outputs:
            self._close_output(fd)

    def _close_output(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        del self._outputs[fd]
        os.close(fd)

    def _close_input(self) -> None:
        fd, self._child.input_fd = self._child.input_fd, None
        if fd is not None:
            self._loop.remove_writer(fd)
            os.close(fd)
            self._wake_writer()  # a writer waiting for room finds the input closed

    async def _writable(self, fd: int) -> None:
        self._input_room = self._loop.create_future()
        self._loop.add_writer(fd, self._wake_writer)
        try:
            await self._input_room
        finally:
            if self._child.input_fd == fd:
                self._loop.remove_writer(fd)

    def _wake_writer(self) -> None:
        if self._input_room is not None and not self._input_room.done():
            self._input_room.set_result(None)


class ProcessTable:
    """The running processes by pid; a process leaves the table when it has been reaped."""

    def __init__(self, reaper: Reaper) -> None:
        self._reaper = reaper
        self._processes: dict[int, Process] = {}
        self._emptied: asyncio.Future[None] | None = None  # set by _forget once kill_all emptied the table

    def start(self, spec: Spec) -> Process:
        """Spawn a process and start reading its output."""
        process = Process(spawn(spec), self._forget)
        self._reaper.watch(process.pid, process.on_exit)
        self._processes[process.pid] = process
        return process

    def find(self, pid: int | None, tag: str | None) -> Process:
        """The process with this pid, else the first with this tag; NotFound otherwise."""
        if pid is not None:
            if pid in self._processes:
                return self._processes[pid]
            raise NotFound(f"process with pid {pid} not found")
        for process in self._processes.values():
            if tag is not None and process.spec.tag == tag:
                return process
        raise NotFound(f"process with tag {tag} not found")

    def __iter__(self) -> Iterator[Process]:
        return iter(list(self._processes.values()))

    async def kill_all(self, grace: float) -> None:
        """SIGKILL every process group, then wait up to `grace` seconds for them to be reaped."""
        for process in self:
            process.signal(signal.SIGKILL)
        if self._processes:
            self._emptied = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._emptied, grace)

    def _forget(self, process: Process) -> None:
        self._processes.pop(process.pid, None)
        if not self._processes and self._emptied is not None and not self._emptied.done():
            self._emptied.set_result(None)
