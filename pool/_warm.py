"""Warm pools: per template, sandboxes started ahead of demand so that a create only has to claim one.

A warm sandbox is an ordinary sandbox of the runtime, started with an id from the caller's id source and no
access token and no egress (`NO_EGRESS`); it has no record, so nothing above the pool can see or reach it until
it is claimed. A claim applies the caller's init (env vars, access token, default user; envd's `POST /init`) to
the running executor, so the sandbox keeps its processes and its id becomes the sandbox's id for good; the
claimer then gives it its egress rules (`Runtime.set_egress`). An empty pool answers `None`
at once and the caller cold-starts: a drained pool costs a dictionary lookup more than a cold start.

The refill is one background coroutine (`run`), woken by every claim and every finished start. Refills are
speculative work, so they give way to the creates they exist for: at most `max_starting` start at a time
across all templates; none starts until `refill_delay` after the last claim (the claimer's first commands,
and the rest of a burst, go first), nor for about one start's duration after a miss (the caller's cold start
then has the CPU to itself). Under a sustained stream of misses refills wait, and every create is a cold
start; they resume once creates slow down. Failing starts back off exponentially per template, logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from executor.envd import ENVD_PORT
from pool._errors import PoolError
from pool._executor_client import post_init
from pool._runtime import ALL_TRAFFIC, EgressRules, ExecutorInit, SandboxSpec
from pool._templates import Template
from pool._warm_state import TemplatePool, WarmPoolStats, resolve_targets

__all__ = ["NO_EGRESS", "WarmPoolStats", "WarmPools", "WarmRuntime", "apply_claim_init"]

NO_EGRESS = EgressRules(deny_out=ALL_TRAFFIC)  # what a warm sandbox may reach before its claim: nothing

_log = logging.getLogger("pool.warm")

_FIRST_GUESS = 0.5  # seconds a start takes, until a refill has measured it


class WarmRuntime(Protocol):
    """The three calls the pool makes on a runtime (every `pool.Runtime` has them)."""

    async def start(self, spec: SandboxSpec) -> None: ...

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None: ...

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket: ...


class WarmPools:
    """Keeps `targets[template]` started sandboxes per template and hands them out to creates."""

    def __init__(
        self,
        runtime: WarmRuntime,
        templates: Mapping[str, Template],
        *,
        new_id: Callable[[], str],
        targets: Mapping[str, int] | None = None,
        max_starting: int = 1,
        refill_delay: float = 0.05,
        claim_timeout: float = 2.0,
        backoff: tuple[float, float] = (0.5, 30.0),
        close_grace: float = 30.0,
    ) -> None:
        """`targets` overrides the templates' own `warm` (the server's `--warm NAME=N`); ValueError if invalid.

        `new_id` names the warm sandboxes (the activator's id source: the id is kept after the claim);
        `max_starting` bounds refills at once: 1 on a small machine that also runs the sandboxes, where a create
        that misses while N refills start shares the CPU with them (loadtests/bench_claim.py), more where the
        runtime starts sandboxes elsewhere (Kubernetes);
        `refill_delay` is how long refills wait after a claim (the claimer's first command and the rest of a burst
        go first);
        `claim_timeout` bounds how long a claim waits on a warm executor before it counts it as dead;
        `backoff` is the first and the longest wait after a failed refill.
        """
        if max_starting < 1 or refill_delay < 0 or claim_timeout <= 0 or not 0 < backoff[0] <= backoff[1]:
            raise ValueError(
                "max_starting must be >= 1, refill_delay >= 0, claim_timeout > 0 and 0 < backoff[0] <= backoff[1]"
            )
        resolved = resolve_targets(templates, targets or {})
        self._runtime = runtime
        self._new_id = new_id
        self._max_starting = max_starting
        self._refill_delay = refill_delay
        self._claim_timeout = claim_timeout
        self._backoff = backoff
        self._close_grace = close_grace
        self._pools = {name: TemplatePool(template, resolved[name]) for name, template in templates.items()}
        # Set by claims, finished refills, `forget` and `close`; cleared and waited on only by `run`.
        self._wanted = asyncio.Event()
        # Set, then replaced by a fresh one, whenever any pool's counts change (`_notify`); awaited by `changed`.
        self._changed = asyncio.Event()
        # The refill tasks in flight (at most `max_starting`): added by `run`, removed by `_refill_done`.
        self._starting: set[asyncio.Task[None]] = set()
        # No refill starts before this monotonic time: claims push it `refill_delay` ahead, misses one start's
        # duration ahead (`_hold_refills`).
        self._quiet_until = 0.0
        # How long a start takes here: a moving average of the refills' own (None before the first), by `_refill`.
        self._start_seconds: float | None = None
        self._closed = False

    async def claim(self, template: str, init: ExecutorInit) -> str | None:
        """Take a ready sandbox of `template`, apply `init` to it, and return its id; None when none is ready.

        Oldest first (FIFO): the oldest warm sandbox has had the longest for its template's start commands
        to come up, and every warm sandbox is handed out within `target` claims of its start.
        """
        pool = self._pools.get(template)
        if pool is None or self._closed:
            return None
        while pool.ready:
            sandbox_id = pool.ready.popleft()
            self._hold_refills(self._refill_delay)
            if await self._adopt(sandbox_id, init):
                pool.claims += 1
                self._notify()
                return sandbox_id
            pool.discarded += 1
        pool.misses += 1
        self._hold_refills(self._start_seconds or _FIRST_GUESS)
        self._notify()
        return None

    def add(self, template: Template, target: int) -> None:
        """Keep `target` sandboxes ready of a template that came after the start (a key's build); ValueError past
        the largest pool."""
        if self._closed or target <= 0 or template.name in self._pools:
            return
        target = resolve_targets({template.name: template}, {template.name: target})[template.name]
        self._pools[template.name] = TemplatePool(template, target)
        self._wanted.set()
        self._notify()

    async def remove(self, name: str) -> None:
        """Stop keeping sandboxes of template `name` (its ready ones are stopped; one starting, once it has)."""
        pool = self._pools.pop(name, None)
        if pool is None:
            return
        unclaimed = list(pool.ready)
        pool.ready.clear()
        self._notify()
        await asyncio.gather(*(self._stop(sandbox_id) for sandbox_id in unclaimed))

    def forget(self, sandbox_id: str) -> bool:
        """Drop a warm sandbox whose processes ended on their own (the runtime's exit listener); True if it was one."""
        for pool in self._pools.values():
            if sandbox_id in pool.ready:
                pool.ready.remove(sandbox_id)
                pool.discarded += 1
                self._wanted.set()
                self._notify()
                return True
        return False

    def stats(self) -> dict[str, WarmPoolStats]:
        """Per template: target, ready, in-flight refills, and the claim / miss / refill counters."""
        now = time.monotonic()
        return {name: pool.stats(now) for name, pool in self._pools.items()}

    async def changed(self) -> None:
        """Return at the next change of any pool's figures: lets tests and benchmarks wait without sleeping."""
        await self._changed.wait()

    async def run(self) -> None:
        """Refill every pool up to its target until `close()`; the app's lifespan runs this as a task.

        Cancelling the task instead also ends it; `close()` is still what stops the unclaimed sandboxes.
        """
        while not self._closed:
            self._wanted.clear()
            self._start_refills()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_retry_in()):
                    await self._wanted.wait()

    async def close(self) -> None:
        """Stop refilling, let the starts in flight finish (or cancel them after `close_grace`), stop the unclaimed."""
        self._closed = True
        self._wanted.set()
        if self._starting:
            _, late = await asyncio.wait(set(self._starting), timeout=self._close_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        unclaimed = [sandbox_id for pool in self._pools.values() for sandbox_id in pool.ready]
        for pool in self._pools.values():
            pool.ready.clear()
        await asyncio.gather(*(self._stop(sandbox_id) for sandbox_id in unclaimed))
        self._notify()

    def _hold_refills(self, seconds: float) -> None:
        """Start no refill for `seconds` from now (or later, if held longer already); `run` re-plans its wait."""
        self._quiet_until = max(self._quiet_until, time.monotonic() + seconds)
        self._wanted.set()

    def _start_refills(self) -> None:
        while len(self._starting) < self._max_starting and (pool := self._neediest()) is not None:
            pool.starting += 1
            task = asyncio.create_task(self._refill(pool), name=f"warm-refill-{pool.template.name}")
            self._starting.add(task)
            task.add_done_callback(self._refill_done)
            self._notify()

    def _refill_done(self, task: asyncio.Task[None]) -> None:
        # Wake `run` only from here, once the task has left `_starting`: woken earlier, it would still count the
        # finished task against `max_starting` and then sleep with a pool below its target.
        self._starting.discard(task)
        self._wanted.set()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _neediest(self) -> TemplatePool | None:
        """The least filled pool that wants a refill now: fair across templates of any size."""
        now = time.monotonic()
        if now < self._quiet_until:
            return None
        wanting = [p for p in self._pools.values() if p.wants(now)]
        return min(wanting, key=lambda p: p.filled / p.target, default=None)

    def _next_retry_in(self) -> float | None:
        """Seconds until a pool below its target may refill again (backoff, quiet time); None: none waits."""
        now = time.monotonic()
        waits = [max(p.retry_at, self._quiet_until) - now for p in self._pools.values() if p.filled < p.target]
        return min((wait for wait in waits if wait > 0), default=None)

    async def _refill(self, pool: TemplatePool) -> None:
        sandbox_id = self._new_id()
        template = pool.template
        init = ExecutorInit(default_user=template.user, default_workdir=template.workdir)
        spec = SandboxSpec(sandbox_id=sandbox_id, template=template, init=init, egress=NO_EGRESS)
        began = time.monotonic()
        try:
            await self._runtime.start(spec)
        # Any failure, not only PoolError: this task's errors have no caller to go to, and claims fall back to
        # cold starts anyway. Unexpected ones are logged with their traceback (`_failed`).
        except Exception as exc:
            self._failed(pool, exc)
        else:
            now = time.monotonic()
            average = self._start_seconds
            self._start_seconds = now - began if average is None else 0.8 * average + 0.2 * (now - began)
            if self._pools.get(template.name) is pool:
                pool.started(sandbox_id, now)
            else:  # the pool was removed while this one started
                await self._stop(sandbox_id)
        finally:
            pool.starting -= 1
            self._notify()

    def _failed(self, pool: TemplatePool, exc: Exception) -> None:
        delay = pool.failed(time.monotonic(), *self._backoff)
        _log.warning(
            "warm pool %s: starting a sandbox failed (%d in a row), next try in %.1f s: %s",
            pool.template.name, pool.failures_in_row, delay, exc, exc_info=not isinstance(exc, PoolError),
        )  # fmt: skip

    async def _adopt(self, sandbox_id: str, init: ExecutorInit) -> bool:
        """Apply the claimer's init to a warm sandbox over a fresh socket; a sandbox that fails is stopped."""
        return await apply_claim_init(
            lambda: self._runtime.open_socket(sandbox_id, ENVD_PORT), init, within=self._claim_timeout,
            discard=lambda: self._stop(sandbox_id), what=f"warm sandbox {sandbox_id}", log=_log,
        )  # fmt: skip

    async def _stop(self, sandbox_id: str) -> None:
        try:
            await self._runtime.stop(sandbox_id)
        except PoolError as exc:
            _log.warning("warm sandbox %s: could not stop it: %s", sandbox_id, exc)


async def apply_claim_init(
    open_socket: Callable[[], Awaitable[socket.socket]],
    init: ExecutorInit,
    *,
    within: float,
    discard: Callable[[], Awaitable[None]],
    what: str,
    log: logging.Logger,
) -> bool:
    """Apply a claimer's `init` to a warm executor (of any kind of warm pool) within `within` seconds; False, and
    `discard()` called, when it fails. Warm executors start without a token, so the current token is None."""
    try:
        async with asyncio.timeout(within):
            await post_init(await open_socket(), init, None)
    except (PoolError, TimeoutError) as exc:
        log.warning("%s did not take its init, discarding it: %s", what, exc)
        await discard()
        return False
    except asyncio.CancelledError:
        # The claimer went away mid-init: nobody will own it, and its init may be half applied.
        await asyncio.shield(discard())
        raise
    return True
