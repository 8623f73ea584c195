"""Background processes of the dev cluster, tracked by pid files that also record the process start time.

The start time (field 22 of /proc/<pid>/stat) guards against pid reuse: a pid file left by a crashed
cluster never makes `down` signal an unrelated process that happens to have the same pid now.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["running_pid", "start_daemon", "stop_daemon"]


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks, or None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def running_pid(run_dir: Path, name: str) -> int | None:
    """The pid of the daemon `name` if it is still the process that was started, else None."""
    try:
        pid_text, started = (run_dir / f"{name}.pid").read_text().split()
    except (OSError, ValueError):
        return None
    pid = int(pid_text)
    return pid if _start_time(pid) == started else None


def start_daemon(
    run_dir: Path, log: Path, name: str, argv: list[str], *, env: Mapping[str, str] | None = None, cwd: Path
) -> int:
    """Start `argv` in its own session, detached from the caller, with its output appended to `log`."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=cwd, env=dict(env) if env is not None else None,
        )  # fmt: skip
    started = _start_time(proc.pid)
    (run_dir / f"{name}.pid").write_text(f"{proc.pid} {started}\n")
    return proc.pid


def stop_daemon(run_dir: Path, name: str, *, grace: float = 10.0) -> bool:
    """SIGTERM the daemon, SIGKILL it after `grace` seconds; True if it was running."""
    pid = running_pid(run_dir, name)
    if pid is not None:
        _signal_and_wait(pid, grace)
    (run_dir / f"{name}.pid").unlink(missing_ok=True)
    return pid is not None


def _signal_and_wait(pid: int, grace: float) -> None:
    started = _start_time(pid)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if _start_time(pid) != started:
                return
            time.sleep(0.05)
