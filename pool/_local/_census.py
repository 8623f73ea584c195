"""Which processes of a sandbox are not the template's own: what a filesystem snapshot would lose for good.

The template's own processes are the executor (pid 1 inside) and its start commands with everything they
started, which a filesystem restore starts again. The executor starts each command in a process group of
its own, so a start command's descendants are recognised by their process group, or by ancestry when one
left the group. The sandbox's autostart command (`pool._autostart`) counts as the template's too, whoever
started it: it and its children carry `AGENT_SANDBOX_AUTOSTART=1` in their environment, and a restore starts
it again; so do the executor's own helpers (`AGENT_SANDBOX_EXECUTOR_HELPER=1`), which it starts again when
needed. Something that left both (`setsid` and a dead parent) without that mark counts as the user's: the
careful answer, since it only keeps a sandbox paused rather than snapshotted. The outer bubblewrap process shares
the sandbox's cgroups but not its pid namespace, and is not part of the sandbox. (A finished start
command's pid taken again by a user's process would pass for the template's; pids inside are reused only
once they wrap at pid_max.)
"""

from __future__ import annotations

from collections.abc import Iterable

from executor.envd import HELPER_ENV
from pool._autostart import AUTOSTART_ENV

__all__ = ["foreign_processes"]

_MARKS = (f"{AUTOSTART_ENV}=1".encode(), f"{HELPER_ENV}=1".encode())


class _Proc:
    """A process as seen from the host: its parent's host pid, and its pid and group inside the sandbox."""

    __slots__ = ("inner_pgid", "inner_pid", "ppid")

    def __init__(self, ppid: int, inner_pid: int, inner_pgid: int) -> None:
        self.ppid = ppid
        self.inner_pid = inner_pid
        self.inner_pgid = inner_pgid


def foreign_processes(host_pids: Iterable[int], start_pids: Iterable[int]) -> list[int]:
    """Host pids among `host_pids` (a sandbox's cgroup) that are neither its executor nor from `start_pids`."""
    procs = {pid: proc for pid in host_pids if (proc := _read(pid)) is not None}
    starts = set(start_pids)
    return [
        pid
        for pid, proc in procs.items()
        if proc.inner_pid != 1
        and proc.inner_pgid not in starts
        and not _descends(pid, procs, starts)
        and not _autostarted(pid)
    ]


def _descends(pid: int, procs: dict[int, _Proc], starts: set[int]) -> bool:
    """Whether `pid` is a start command or runs under one (the walk ends at the executor, whose parent is
    the outer bubblewrap process, not in `procs`)."""
    seen: set[int] = set()
    while pid in procs and pid not in seen:
        seen.add(pid)
        proc = procs[pid]
        if proc.inner_pid in starts:
            return True
        pid = proc.ppid
    return False


def _autostarted(pid: int) -> bool:
    """Whether the process runs with the autostart or the executor's helper mark in its environment (at exec)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return False
    return any(mark in environ for mark in _MARKS)


def _read(pid: int) -> _Proc | None:
    """The process's figures, or None when it is gone or lives outside the sandbox's pid namespace."""
    fields: dict[str, list[int]] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("PPid", "NSpid", "NSpgid"):
                    fields[name] = [int(v) for v in value.split()]
    except (OSError, ValueError):
        return None
    nspid, nspgid = fields.get("NSpid", []), fields.get("NSpgid", [])
    if len(nspid) < 2 or not nspgid or not fields.get("PPid"):
        return None  # the outer bubblewrap process: in the host's pid namespace only
    return _Proc(fields["PPid"][0], nspid[-1], nspgid[-1])
