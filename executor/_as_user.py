"""Running a file operation (`_fs_ops`) with the rights of the user a request names.

Root's operations run in the executor itself, in a thread (a big remove or listing must not stall its loop).
Anyone else's run in a helper process (`_fs_worker`): `python3 -I -S` started as that user, with its uid, gid
and supplementary groups exactly as `_spawn` starts its commands, so the kernel checks every permission, every
step of a path, every symbolic link and every /proc link as it does for a shell of that user (EACCES is
`PermissionDenied`: 403, or `permission_denied` over Connect). Where the executor itself is not root it cannot
change user, and everything runs with its own rights.

Why processes: credentials are per thread in the kernel, but glibc's setgroups() (what os.setgroups
calls) changes every thread of the process; and a thread of pid 1, whatever its fsuid, is pid 1 to
/proc, so /proc/1/root, /proc/self/mem and /proc/self/fd/* would be the executor's own for any user.
A helper is a process of that user, as a shell is. Why long-lived: starting one costs 60-190 ms
(the interpreter and msgspec, on a loaded 2-core host), a call to a running one a tenth of a
millisecond or so (docs/security.md has the measurement). So the default user's helper is started
with the executor (`prepare`), and a user's last helper stays; each user has at most `PER_USER`, each
serving one call at a time, and any but the last left idle for `IDLE_SECONDS` is stopped.

A helper is trusted no more than its user: its replies are decoded into their declared types, a file
descriptor it sends is only read or written, and nothing it returns is then done with root's rights.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from executor._errors import ExecutorError, Internal
from executor._fs_ops import Descriptor
from executor._fs_worker import FAILED, HEADER, OK
from executor._reaper import Reaper
from executor._spawn import CHILD_OOM_SCORE_ADJ
from executor._users import User, lookup
from executor.envd import HELPER_ENV

__all__ = ("AsUser",)

logger = logging.getLogger("executor")

T = TypeVar("T")
PER_USER = 4
IDLE_SECONDS = 60.0
MAX_REPLY_BYTES = 512 * 1024 * 1024
_READ = 1024 * 1024
_FD_SPACE = socket.CMSG_SPACE(4 * struct.calcsize("i"))
_BOOT = "import json, sys; sys.path[:] = json.loads(sys.argv[1]); from executor._fs_worker import main; main()"
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", HELPER_ENV: "1"}
_ERRORS: dict[str, type[ExecutorError]] = {kind.__name__: kind for kind in ExecutorError.__subclasses__()}
_encode = msgspec.msgpack.Encoder().encode

Identity = tuple[int, int, tuple[int, ...] | None]  # uid, gid, supplementary groups


class AsUser:
    """The helpers of every user, started on a user's first call (the default user's at start-up: `prepare`)."""

    def __init__(self, reaper: Reaper) -> None:
        self._reaper = reaper
        self._pools: dict[Identity, _Pool] = {}

    async def run(self, user: User, op: Callable[..., T], *args: Any) -> T:
        """`op(*args)` with the rights of `user`: its result, or the ExecutorError it raised."""
        pool = self._pool(user)
        return await asyncio.to_thread(op, *args) if pool is None else await pool.run(op, args)

    def prepare(self, name: str) -> None:
        """Start a helper for the user called `name` unless it has one (or needs none, or does not exist)."""
        try:
            pool = self._pool(lookup(name))
            if pool is not None:
                pool.prepare()
        except ExecutorError as exc:  # no such user, or no helper can start: its first request says so
            logger.warning("no file helper for the default user %r yet: %s", name, exc.message)

    def close(self) -> None:
        """Stop every helper."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _pool(self, user: User) -> _Pool | None:
        """The helpers of `user`; None when its operations run in the executor."""
        if user.uid == 0 or os.geteuid() != 0:
            return None
        groups = user.extra_groups()
        identity = (user.uid, user.gid, None if groups is None else tuple(groups))
        if identity not in self._pools:
            for stale in [other for other in self._pools if other[0] == user.uid]:  # its groups or gid changed
                self._pools.pop(stale).close()
            self._pools[identity] = _Pool(identity, self._reaper)
        return self._pools[identity]


class _Pool:
    """The helpers of one identity: up to PER_USER of them; idle ones stop after IDLE_SECONDS, but the last."""

    def __init__(self, identity: Identity, reaper: Reaper) -> None:
        self._identity = identity
        self._reaper = reaper
        self._slots = asyncio.Semaphore(PER_USER)
        self._helpers: set[_Helper] = set()  # every live one; these three are touched only by the event loop
        self._idle: list[_Helper] = []
        self._closed = False

    async def run(self, op: Callable[..., T], args: tuple[Any, ...]) -> T:
        async with self._slots:
            helper = self._take_idle() or self._start()
            try:
                return await helper.call(op, args)
            finally:
                if helper.broken or self._closed:
                    self._close(helper)
                else:
                    self._idle.append(helper)
                    helper.expire_later(IDLE_SECONDS, self._expire)

    def prepare(self) -> None:
        if not self._helpers:
            self._idle.append(self._start())

    def close(self) -> None:
        """Stop the idle helpers now and the busy ones when their call ends."""
        self._closed = True
        for helper in self._idle:
            self._close(helper)
        self._idle.clear()

    def _start(self) -> _Helper:
        helper = _Helper.start(self._identity, self._reaper)
        self._helpers.add(helper)
        return helper

    def _take_idle(self) -> _Helper | None:
        while self._idle:
            helper = self._idle.pop()
            if helper.alive():
                return helper
            self._close(helper)
        return None

    def _expire(self, helper: _Helper) -> None:
        if helper in self._idle and len(self._helpers) > 1:
            self._idle.remove(helper)
            self._close(helper)

    def _close(self, helper: _Helper) -> None:
        self._helpers.discard(helper)
        helper.close()


class _Helper:
    """One helper process and the executor's end of its socket (non-blocking)."""

    def __init__(self, popen: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self._popen = popen
        self._sock = sock
        self._timer: asyncio.TimerHandle | None = None
        self.broken = False  # the conversation is out of step or the helper is gone: never use it again

    @classmethod
    def start(cls, identity: Identity, reaper: Reaper) -> _Helper:
        uid, gid, groups = identity
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        path = json.dumps([os.path.abspath(entry) for entry in sys.path])
        try:
            popen = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOT, path],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # not the executor's log: the user could reopen it through /proc
                cwd="/",
                env=_ENV,
                user=uid,
                group=gid,
                extra_groups=None if groups is None else list(groups),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            ours.close()
            raise Internal(f"cannot start the file helper of uid {uid}: {exc}") from exc
        finally:
            theirs.close()
        reaper.watch(popen.pid, _on_exit(popen))  # in the fork's loop step: the SIGCHLD cannot come first
        with contextlib.suppress(OSError), open(f"/proc/{popen.pid}/oom_score_adj", "w") as score:
            score.write(str(CHILD_OOM_SCORE_ADJ))  # like every process the executor starts (`_spawn`)
        ours.setblocking(False)
        return cls(popen, ours)

    async def call(self, op: Callable[..., T], args: tuple[Any, ...]) -> T:
        """Send one call and decode its reply; the op's ExecutorError is raised, anything else breaks the helper."""
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        try:
            request = _encode((op.__name__, list(args)))
            await loop.sock_sendall(self._sock, HEADER.pack(OK, len(request)) + request)
            status, payload, fds = await self._receive(loop)
        except BaseException as exc:
            self.broken = True
            if isinstance(exc, (OSError, EOFError)):
                raise Internal(f"the file helper failed: {exc or 'it exited'}") from exc
            raise
        return self._decode(op, status, payload, fds)

    def alive(self) -> bool:
        """Whether an idle helper can take a call: not reaped, and nothing to read (EOF: it exited)."""
        if self._popen.returncode is not None:
            return False
        try:
            self._sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            pass
        return False

    def expire_later(self, delay: float, expire: Callable[[_Helper], None]) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay, expire, self)

    def close(self) -> None:
        """Close the socket (an idle helper exits on EOF); a broken one is killed, as it may be stuck in a call."""
        if self._timer is not None:
            self._timer.cancel()
        self._sock.close()
        if self.broken and self._popen.returncode is None:  # not reaped yet: the pid is still this process
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._popen.pid, signal.SIGKILL)

    def _decode(self, op: Callable[..., T], status: int, payload: bytes, fds: list[int]) -> T:
        try:
            if status == FAILED:
                name, message = msgspec.msgpack.decode(payload, type=tuple[str, str])
                raise _ERRORS.get(name, Internal)(message)
            result: T = msgspec.msgpack.decode(payload, type=_result_type(op))
            if isinstance(result, Descriptor):
                if len(fds) != 1:
                    self.broken = True
                    raise Internal(f"the file helper sent {len(fds)} file descriptors instead of one")
                result.fd = fds.pop()
            return result
        except msgspec.MsgspecError as exc:
            self.broken = True
            raise Internal(f"the file helper sent a malformed reply: {exc}") from exc
        finally:
            _close(fds)  # whatever was not handed over

    async def _receive(self, loop: asyncio.AbstractEventLoop) -> tuple[int, bytes, list[int]]:
        data = bytearray()
        fds: list[int] = []
        try:
            while len(data) < HEADER.size or len(data) < HEADER.size + HEADER.unpack_from(data)[1]:
                if len(data) >= HEADER.size and HEADER.unpack_from(data)[1] > MAX_REPLY_BYTES:
                    raise EOFError(f"a reply of more than {MAX_REPLY_BYTES} bytes")
                data += await self._recv_some(loop, fds)
        except BaseException:
            _close(fds)
            raise
        status, length = HEADER.unpack_from(data)
        return status, bytes(data[HEADER.size : HEADER.size + length]), fds

    async def _recv_some(self, loop: asyncio.AbstractEventLoop, fds: list[int]) -> bytes:
        while True:
            try:
                chunk, ancillary, _, _ = self._sock.recvmsg(_READ, _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                await _readable(loop, self._sock)
                continue
            for level, kind, item in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(struct.unpack(f"{len(item) // 4}i", item[: len(item) - len(item) % 4]))
            if not chunk:
                raise EOFError()
            return chunk


def _on_exit(popen: subprocess.Popen[bytes]) -> Callable[[int], None]:
    def exited(status: int) -> None:
        popen.returncode = os.waitstatus_to_exitcode(status)  # so Popen never waits: the Reaper does

    return exited


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


@functools.cache
def _result_type(op: Callable[..., object]) -> Any:
    """The declared result type of an op, which its reply is decoded into."""
    return typing.get_type_hints(op)["return"]


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
