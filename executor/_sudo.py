"""Passwordless `sudo` in the sandbox without a setuid binary: the executor starts the command as root on request.

Why: bubblewrap sets no_new_privs, so the image's setuid /usr/bin/sudo cannot raise privileges, while E2B's
`user` has passwordless sudo and agents write `sudo apt-get install ...` all the time. The `sudo` ahead of it
on PATH (/usr/local/bin/sudo, `executor/sudo.py`) hands this server its argv, environment, working directory
and its own stdin, stdout and stderr over a Unix socket (`_sudo_wire`); the executor starts the command as the
asked user (root unless `-u`), in its own process group, on those very streams, passes on the signals the
`sudo` process receives, and answers the exit status, which `sudo` exits with.

Who may ask: the kernel names the caller's uid (SO_PEERCRED, not forgeable). Root, the sandbox's default user
(the `user` to whom E2B gives passwordless sudo) and members of the `sudo` group may; anyone else is refused,
so a service account inside (a web server's) does not become root through it.

Why it gives no more than root inside already has: the command is started exactly as `commands.run(...,
user="root")` starts one, as a child of the executor, in the sandbox's namespaces, with the sandbox's
capability set (valid only in its user namespace), its seccomp filter and no_new_privs, so it can do what
any root process of the sandbox can and nothing more. The socket's name is abstract, in the sandbox's own
network namespace: only processes of the sandbox reach it. It is served only when the executor is pid 1
(a sandbox's init); an executor run on a host (tests) would otherwise offer root to the host's users.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import pwd
import socket
import struct
import subprocess
from collections.abc import Coroutine
from typing import Any

from executor._defaults import Defaults
from executor._errors import ExecutorError
from executor._reaper import Reaper
from executor._spawn import Spec, start_on
from executor._sudo_wire import EXITED, MAX_REQUEST, REFUSED, SOCKET, STATUS
from executor._users import lookup

__all__ = ("SudoServer",)

logger = logging.getLogger("executor")
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_RECEIVE_SECONDS = 10.0  # a caller that connects and sends nothing is dropped after this


class Refused(Exception):
    """The request is not served: the message goes to the caller's stderr."""


class SudoServer:
    """Listens on the sudo socket; one task per caller, each until its command ends."""

    def __init__(self, defaults: Defaults, reaper: Reaper) -> None:
        self._defaults = defaults
        self._reaper = reaper
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the accept loop and one per caller; only the loop adds

    def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        listener.setblocking(False)
        try:
            listener.bind(SOCKET)
        except OSError as exc:
            listener.close()
            logger.warning("sudo is not served: %s", exc)
            return
        listener.listen(64)
        self._listener = listener
        self._spawn_task(self._accept(listener))

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._listener is not None:
            self._listener.close()

    def _spawn_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            self._spawn_task(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            caller = _CREDENTIALS.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))[1]
            async with asyncio.timeout(_RECEIVE_SECONDS):
                await _readable(conn)
            message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
            status = await self._run(conn, caller, message, fds)
            conn.send(EXITED + STATUS.pack(status))
        except Refused as exc:
            with contextlib.suppress(OSError):
                conn.send(REFUSED + str(exc).encode())
        except (OSError, TimeoutError):
            pass  # the caller went away: nothing to answer
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()

    async def _run(self, conn: socket.socket, caller: int, message: bytes, fds: list[int]) -> int:
        """Start the command on the caller's streams, pass on its signals, and return its exit status."""
        if not self._allowed(caller):
            raise Refused(f"sudo: {_name(caller)} is not allowed to run sudo in this sandbox")
        popen = _start(message, fds)  # kept until it exits: a dropped Popen would be waited for by the next one
        exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reaper.watch(popen.pid, exited.set_result)  # in the fork's loop step: the SIGCHLD cannot come first
        forwarding = asyncio.get_running_loop().create_task(_forward_signals(conn, popen.pid))
        try:
            status = await exited
        finally:
            forwarding.cancel()
        popen.returncode = code = os.waitstatus_to_exitcode(status)  # so Popen never waits
        return code if code >= 0 else 128 - code

    def _allowed(self, uid: int) -> bool:
        if uid == 0:
            return True
        try:
            account = pwd.getpwuid(uid)
        except KeyError:
            return False
        if account.pw_name == self._defaults.user:
            return True
        try:
            group = grp.getgrnam("sudo")
        except KeyError:
            return False
        return account.pw_name in group.gr_mem or account.pw_gid == group.gr_gid


def _start(message: bytes, fds: list[int]) -> subprocess.Popen[bytes]:
    """Fork and exec the request on the caller's streams, then close the executor's copies of them."""
    argv, user, env, cwd = _request(message, len(fds))
    try:
        spec = Spec(argv, env, cwd if os.path.isdir(cwd) else "/", lookup(user))
        return start_on(spec, *fds)
    except ExecutorError as exc:
        raise Refused(f"sudo: {exc.message}") from exc
    finally:
        for fd in fds:  # the command has its copies: a reader of the caller's stdout sees EOF when it ends
            os.close(fd)
        fds.clear()


async def _readable(conn: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    loop.add_reader(conn.fileno(), ready.set)
    try:
        await ready.wait()
    finally:
        loop.remove_reader(conn.fileno())


async def _forward_signals(conn: socket.socket, pid: int) -> None:
    """Each byte the caller sends is a signal for the command's process group; EOF ends the forwarding."""
    loop = asyncio.get_running_loop()
    while signals := await loop.sock_recv(conn, 64):
        for number in signals:
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.killpg(pid, number)


def _request(message: bytes, streams: int) -> tuple[list[str], str, dict[str, str], str]:
    """The request's argv, user, environment and working directory; Refused if it is not one."""
    try:
        request = json.loads(message)
        argv, user, env, cwd = request["argv"], request["user"], request["env"], request["cwd"]
    except (ValueError, TypeError, KeyError) as exc:
        raise Refused(f"sudo: invalid request: {exc}") from exc
    valid = (
        streams == 3
        and isinstance(argv, list) and argv and all(isinstance(arg, str) for arg in argv)
        and isinstance(user, str) and isinstance(cwd, str)
        and isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    )  # fmt: skip
    if not valid:
        raise Refused("sudo: invalid request: argv, user, env, cwd and three streams are needed")
    return argv, user, env, cwd


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
