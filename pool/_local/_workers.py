"""The local runtime's blocking work, in bounded thread pools of its own kind, off asyncio's default pool.

One tenant's slow work must never queue another tenant's create or kill behind it: asyncio's default pool
(6 threads on 2 cores) was shared by everything, and 24 metrics calls walking one sandbox's 300,000 files
held another key's create for 66 s. So each kind of work waits only for its own kind:

    lifecycle   a sandbox's directory and filesystem, its launch, its teardown, its egress set-up: short
    snapshots   CRIU dumps and restores, and settling them after a restart: seconds each
    copies      images restored into new sandboxes (forks, snapshots with memory): their layer copy and restore
    builds      template layers (debootstrap, apt, registry pulls, layer commits): minutes each
    walks       the size of a writable layer that has no filesystem of its own (`disk_limit` off)
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["Workers"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


class Workers:
    """One pool per kind of blocking work; `run(pool, fn, ...)` is `asyncio.to_thread` on that pool."""

    def __init__(self) -> None:
        self.lifecycle = ThreadPoolExecutor(8, thread_name_prefix="sandbox-lifecycle")
        self.snapshots = ThreadPoolExecutor(4, thread_name_prefix="sandbox-snapshot")
        # CRIU restores wait much of their time: four side by side took 264 ms a copy on 2 cores, two 417 ms.
        self.copies = ThreadPoolExecutor(4, thread_name_prefix="sandbox-copy")
        self.builds = ThreadPoolExecutor(2, thread_name_prefix="template-build")
        self.walks = ThreadPoolExecutor(1, thread_name_prefix="disk-walk")

    @staticmethod
    async def run(pool: ThreadPoolExecutor, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(pool, call)

    def close(self) -> None:
        """Let running work finish in its threads, without waiting here (the runtime is closing)."""
        for pool in (self.lifecycle, self.snapshots, self.copies, self.builds, self.walks):
            pool.shutdown(wait=False, cancel_futures=True)
