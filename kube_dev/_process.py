"""One run of one container: a host process in a cgroup of its own, with its output in a log file."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Mapping
from pathlib import Path

from kube_dev._tracking import ProcessTracker

__all__ = ["ContainerProcess"]


class ContainerProcess:
    """A started container process; `wait()` gives its exit code, `stop()` ends it and everything it started."""

    def __init__(self, proc: asyncio.subprocess.Process, cgroup: Path | None, tracker: ProcessTracker) -> None:
        self._proc = proc
        self._cgroup = cgroup
        self._tracker = tracker

    @classmethod
    async def start(
        cls, tracker: ProcessTracker, cgroup_name: str, argv: list[str], *, env: Mapping[str, str], cwd: Path,
        log: Path,
    ) -> ContainerProcess:  # fmt: skip
        """Start `argv`; raises OSError when it cannot be executed (missing binary, no permission)."""
        cgroup = tracker.create(cgroup_name)
        try:
            with log.open("ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=tracker.joiner(cgroup),
                )  # fmt: skip
        except OSError:
            tracker.remove(cgroup)
            raise
        return cls(proc, cgroup, tracker)

    async def wait(self) -> int:
        """The exit code (128 + signal number for a signal, as container runtimes report it)."""
        code = await self._proc.wait()
        await self._kill_rest()  # the container ends with its main process, as when its pid namespace's init exits
        return 128 - code if code < 0 else code

    async def stop(self, grace: float) -> None:
        """SIGTERM, then after `grace` seconds SIGKILL for every process left in the container."""
        if self._proc.returncode is None:
            self._tracker.terminate(self._proc.pid)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await self._proc.wait()
        await self._kill_rest()
        await self._proc.wait()

    async def _kill_rest(self) -> None:
        # Without a cgroup the process group is all there is: its id stays reserved while it has members.
        pgid = self._proc.pid if self._cgroup is None else None
        await asyncio.to_thread(self._tracker.kill, self._cgroup, pgid)
        self._tracker.remove(self._cgroup)
