"""A short history of each running sandbox's resource use, for E2B's `GET /sandboxes/{id}/metrics?start=&end=`.

Samples come from the runtime's `stats` (cgroup counters; the local runtime also sizes the writable layer, which
is why requests never read it themselves): one per sandbox every `SAMPLE_INTERVAL` seconds from the sampler loop,
or from a request that finds the newest sample older than that (so a new sandbox has one at once), and never more
often. Each sandbox keeps its last `SAMPLES_KEPT`, ten minutes' worth; memory is bounded by that times the live
sandboxes. Only running sandboxes are sampled (a frozen or snapshotted one has nothing to measure), and a killed
one's samples go at the next pass. Each gateway replica samples the sandboxes it knows, on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from typing import NamedTuple

from activator._errors import ActivatorError
from activator._machine import runtime_call
from activator._records import SandboxRecord, SandboxState
from pool import Runtime, SandboxStats

__all__ = ["SAMPLES_KEPT", "SAMPLE_INTERVAL", "MetricsRing", "Sample"]

SAMPLE_INTERVAL = 5.0  # seconds between two samples of one sandbox
SAMPLES_KEPT = 120  # samples kept per sandbox: the last ten minutes

_log = logging.getLogger("activator")


class Sample(NamedTuple):
    """One reading of a sandbox's resource use, and the clock time it was taken."""

    at: float
    stats: SandboxStats


class MetricsRing:
    """The last `SAMPLES_KEPT` samples of every running sandbox, taken at most every `SAMPLE_INTERVAL` seconds."""

    def __init__(self, runtime: Runtime, clock: Callable[[], float]) -> None:
        self._runtime = runtime
        self._clock = clock
        # id -> its samples, oldest first. Changed only on the event loop, between awaits.
        self._rings: dict[str, deque[Sample]] = {}

    async def sample_if_due(self, sandbox_id: str) -> None:
        """Read the sandbox's stats now unless its newest sample is younger than `SAMPLE_INTERVAL`."""
        newest = self.newest(sandbox_id)
        if newest is not None and self._clock() - newest.at < SAMPLE_INTERVAL:
            return
        stats = await runtime_call(f"read the stats of {sandbox_id}", self._runtime.stats(sandbox_id))
        ring = self._rings.setdefault(sandbox_id, deque(maxlen=SAMPLES_KEPT))
        ring.append(Sample(self._clock(), stats))

    def newest(self, sandbox_id: str) -> Sample | None:
        """The sandbox's latest sample, if it has one."""
        ring = self._rings.get(sandbox_id)
        return ring[-1] if ring else None

    def between(self, sandbox_id: str, start: int | None, end: int | None) -> list[Sample]:
        """The samples stamped within [start, end], oldest first, compared in whole seconds as E2B's SDK sends
        them (`int(datetime.timestamp())`): a sample taken at N.7 s is inside `end=N`."""
        return [
            sample
            for sample in self._rings.get(sandbox_id, ())
            if (start is None or start <= int(sample.at)) and (end is None or int(sample.at) <= end)
        ]

    async def run(self, live: Callable[[], Mapping[str, SandboxRecord]]) -> None:
        """Every `SAMPLE_INTERVAL` seconds, one pass over the sandboxes `live()` holds, until cancelled."""
        while True:
            await self.sample_all(dict(live()))
            await asyncio.sleep(SAMPLE_INTERVAL)

    async def sample_all(self, live: Mapping[str, SandboxRecord]) -> None:
        """One pass: forget the sandboxes no longer live, sample the running ones that are due (one at a time,
        so a pass never has more than one `stats` call in flight)."""
        for gone in self._rings.keys() - live.keys():
            del self._rings[gone]
        for sandbox_id in [i for i, record in live.items() if record.state is SandboxState.RUNNING]:
            try:
                await self.sample_if_due(sandbox_id)
            except ActivatorError as exc:  # it stopped or froze meanwhile: the next pass knows
                _log.debug("sandbox %s: no metrics sample: %s", sandbox_id, exc)
