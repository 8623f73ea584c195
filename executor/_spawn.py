"""Starting one process as a given user, with pipes or a PTY.

`subprocess.Popen` does the fork/exec (setgroups/setgid/setuid, cwd, env, closing inherited fds);
it is never asked to wait, because the Reaper owns all waiting. Without a PTY the process gets its
own process group and three pipes (stdin is /dev/null unless asked for); with one it gets a new
session whose controlling terminal is the PTY (the one step Popen lacks, done in `preexec_fn`).

Every process started here is the OOM killer's first choice (oom_score_adj 1000) and the executor, the
sandbox's pid 1, its last: filling the sandbox's memory or /dev/shm kills the offender, not the sandbox
(its files went with it). Lowering pid 1 instead would need CAP_SYS_RESOURCE on the host, which container
hosts withhold, and its children would inherit it. The value is written from here right after the fork,
not in the child: a `preexec_fn` makes Popen fork the whole executor instead of vfork-ing (+6.6 ms a command,
measured), `choom` costs an exec (+0.85 ms); a process the child forks before the write keeps 0
(microseconds when idle, longer on a loaded machine).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import subprocess
import termios
from collections.abc import Callable
from dataclasses import dataclass, field

from executor._errors import InvalidArgument
from executor._users import User

__all__ = ("CHILD_OOM_SCORE_ADJ", "Child", "Spec", "set_window_size", "spawn", "start_on")

CHILD_OOM_SCORE_ADJ = 1000


@dataclass(frozen=True)
class Spec:
    """Everything needed to start a process."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    user: User
    stdin: bool = False
    pty_size: tuple[int, int] | None = None  # (cols, rows)
    tag: str | None = None
    timeout: float | None = None  # SIGKILL after this many seconds
    request_envs: dict[str, str] = field(default_factory=dict)  # as asked, for List


@dataclass
class Child:
    """A spawned process and the executor's ends of its streams."""

    spec: Spec
    popen: subprocess.Popen[bytes]
    outputs: dict[int, str]  # fd -> "stdout" | "stderr" | "pty"
    input_fd: int | None  # stdin pipe, or a dup of the PTY master
    pty_fd: int | None


def spawn(spec: Spec) -> Child:
    """Fork and exec `spec`; InvalidArgument if that fails (no such command, bad cwd…)."""
    if spec.pty_size is not None:
        return _spawn_with_pty(spec, *spec.pty_size)
    return _spawn_with_pipes(spec)


def start_on(spec: Spec, stdin: int, stdout: int, stderr: int) -> subprocess.Popen[bytes]:
    """Fork and exec `spec` on streams someone else opened (`sudo`'s own), in its own process group."""
    return _popen(spec, stdin, stdout, stderr, new_session=False)


def set_window_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _spawn_with_pipes(spec: Spec) -> Child:
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    in_read, in_write = os.pipe() if spec.stdin else (subprocess.DEVNULL, -1)
    try:
        popen = _popen(spec, in_read, out_write, err_write, new_session=False)
    except BaseException:
        _close(out_read, err_read, in_write)
        raise
    finally:
        _close(out_write, err_write, in_read)
    for fd in (out_read, err_read, in_write):
        if fd >= 0:
            os.set_blocking(fd, False)
    return Child(spec, popen, {out_read: "stdout", err_read: "stderr"}, in_write if in_write >= 0 else None, None)


def _spawn_with_pty(spec: Spec, cols: int, rows: int) -> Child:
    master, slave = os.openpty()
    set_window_size(master, cols, rows)
    with contextlib.suppress(OSError):
        os.fchown(slave, spec.user.uid, -1)  # so the user's programs can reopen their terminal
    try:
        popen = _popen(spec, slave, slave, slave, new_session=True)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    return Child(spec, popen, {master: "pty"}, os.dup(master), master)


def _popen(spec: Spec, stdin: int, stdout: int, stderr: int, *, new_session: bool) -> subprocess.Popen[bytes]:
    user = spec.user
    preexec: Callable[[], None] | None = _take_controlling_terminal if new_session else None
    try:
        popen = subprocess.Popen(
            spec.argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=spec.cwd,
            env=spec.env,
            user=user.uid,
            group=user.gid,
            extra_groups=user.extra_groups(),
            start_new_session=new_session,
            process_group=None if new_session else 0,
            preexec_fn=preexec,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise InvalidArgument(f"error starting process '{' '.join(spec.argv)}': {exc}") from exc
    with contextlib.suppress(OSError), open(f"/proc/{popen.pid}/oom_score_adj", "w") as f:  # OSError: it is gone
        f.write(str(CHILD_OOM_SCORE_ADJ))
    return popen


def _take_controlling_terminal() -> None:
    """Runs in the child, after setsid(): make the PTY on stdin its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)
