"""One leader among the gateway replicas, elected on a coordination.k8s.io/v1 Lease, for the background loops.

The lease is free when it has no holder, or when its holder has not renewed it for its leaseDurationSeconds:
by the renewTime it carries (wall clocks, synced in a cluster), or, should this replica's clock be behind, by
this replica's own observation that the lease has not changed for that long (what client-go does). Taking and
renewing are writes with the resourceVersion just read, so of two candidates one gets 409 and loses.

A leader renews every `renew_every` (a third of the lease by default). It steps down when someone else holds
the lease or wrote it first (409), or when it could not renew it for the lease's duration (the others may take
it from then on). `release()` on a clean shutdown clears the holder, so the next replica takes over at its next
try rather than once the lease has expired.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import time
from collections.abc import Awaitable, Callable

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError

__all__ = ["LeaderElection", "while_leading"]

_log = logging.getLogger("pool.kubernetes")


class _Meta(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    name: str
    resource_version: str | None = None  # sent back on every write: optimistic concurrency


class _LeaseSpec(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    holder_identity: str | None = None
    lease_duration_seconds: int | None = None
    acquire_time: str | None = None  # MicroTime, "2026-11-29T00:00:00.000000Z"
    renew_time: str | None = None
    lease_transitions: int | None = None


class _Lease(msgspec.Struct, kw_only=True, rename="camel"):
    metadata: _Meta
    spec: _LeaseSpec = msgspec.field(default_factory=_LeaseSpec)
    api_version: str = "coordination.k8s.io/v1"
    kind: str = "Lease"


_decode_lease = msgspec.json.Decoder(_Lease).decode


class LeaderElection:
    """Campaigns for, holds and hands over one Lease; `is_leader` says whether this replica leads right now."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        *,
        name: str = "agent-sandbox-leader",
        identity: str,
        lease_duration: float = 15.0,
        renew_every: float | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`identity`: unique per replica (the pod's name); `on_change(leading)` runs on every change."""
        renew_every = renew_every or lease_duration / 3
        if not identity or lease_duration < 1 or not 0 < renew_every < lease_duration:
            raise ValueError("a leader election needs an identity, a lease of 1 s or more, and renewals within it")
        self._api = api
        self._leases = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._name = name
        self._path = f"{self._leases}/{name}"
        self._where = f"{namespace}/{name}"
        self._identity = identity
        self._seconds = math.ceil(lease_duration)  # the Lease holds whole seconds
        self._renew_every = renew_every
        self._on_change = on_change
        self._clock = clock
        self._leading = False
        self._renewed = 0.0  # monotonic time at which the last successful write as leader began
        self._failing = False  # whether the last try failed (logged once per streak)
        # The other holder's lease as first seen: (resourceVersion, monotonic time), for the clock-independent expiry.
        self._observed: tuple[str | None, float] = (None, 0.0)
        self._flipped = asyncio.Event()  # set (and replaced) at every change of `is_leader`

    @property
    def is_leader(self) -> bool:
        return self._leading

    async def changed(self) -> bool:
        """Wait for the next change of leadership; the new `is_leader`."""
        await self._flipped.wait()
        return self._leading

    async def run(self) -> None:
        """Campaign, then renew, until cancelled. Cancelled without `release()`, the others wait for expiry."""
        try:
            while True:
                await self._try()
                await asyncio.sleep(self._renew_every)
        finally:
            self._set(False)

    async def release(self) -> None:
        """Clear the holder if it is this replica, so another takes over at once (after `run` is cancelled)."""
        self._set(False)
        try:
            lease = await self._read()
            if lease is not None and lease.spec.holder_identity == self._identity:
                now = _micro_time(self._clock())
                spec = _LeaseSpec(lease_duration_seconds=1, acquire_time=now, renew_time=now,
                                  lease_transitions=lease.spec.lease_transitions)  # fmt: skip
                await self._write("PUT", _Lease(metadata=lease.metadata, spec=spec))
        except RuntimeFailure as exc:
            _log.warning(
                "leader lease %s: could not release it, the others wait for it to expire: %s", self._where, exc
            )

    async def _try(self) -> None:
        began = time.monotonic()
        try:
            lease = await self._read()
            if lease is None:
                await self._write("POST", _Lease(metadata=_Meta(name=self._name), spec=self._spec()))
            elif lease.spec.holder_identity == self._identity:
                await self._write("PUT", _Lease(metadata=lease.metadata, spec=self._spec(lease.spec)))
            elif self._free(lease, began):
                await self._write("PUT", _Lease(metadata=lease.metadata, spec=self._spec(taken_from=lease.spec)))
            else:
                self._set(False)
                return
        except KubeApiError as exc:
            if exc.status == 409:  # another replica wrote it first
                self._set(False)
            else:
                self._failed(exc)
            return
        except RuntimeFailure as exc:
            self._failed(exc)
            return
        self._failing = False
        self._renewed = began
        self._set(True)

    def _free(self, lease: _Lease, now: float) -> bool:
        spec = lease.spec
        if not spec.holder_identity:
            return True
        if lease.metadata.resource_version != self._observed[0]:
            self._observed = (lease.metadata.resource_version, now)
        duration = spec.lease_duration_seconds or self._seconds
        renewed = _parse_time(spec.renew_time)
        if renewed is not None and renewed + duration < self._clock():
            return True
        return now - self._observed[1] > duration

    def _spec(self, held: _LeaseSpec | None = None, *, taken_from: _LeaseSpec | None = None) -> _LeaseSpec:
        """Ours, renewed now: `held` when we hold it already, `taken_from` when taking it over."""
        now = _micro_time(self._clock())
        if held is not None:
            return msgspec.structs.replace(held, lease_duration_seconds=self._seconds, renew_time=now)
        transitions = (taken_from.lease_transitions or 0) + 1 if taken_from is not None else 0
        return _LeaseSpec(holder_identity=self._identity, lease_duration_seconds=self._seconds, acquire_time=now,
                          renew_time=now, lease_transitions=transitions)  # fmt: skip

    def _failed(self, exc: RuntimeFailure) -> None:
        if not self._failing:
            _log.warning("leader lease %s: %s", self._where, exc)
        self._failing = True
        if self._leading and time.monotonic() - self._renewed > self._seconds:
            _log.warning(
                "leader lease %s: not renewed for %d s, %s steps down", self._where, self._seconds, self._identity
            )
            self._set(False)

    async def _read(self) -> _Lease | None:
        try:
            return _decode_lease(await self._api.call("GET", self._path))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _write(self, method: str, lease: _Lease) -> None:
        await self._api.call(method, self._leases if method == "POST" else self._path, body=lease)

    def _set(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        _log.info("leader lease %s: %s %s", self._where, self._identity, "leads" if leading else "no longer leads")
        self._flipped.set()
        self._flipped = asyncio.Event()
        if self._on_change is not None:
            self._on_change(leading)


async def while_leading(election: LeaderElection, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work()` as a task while `election` leads: cancelled when leadership is lost, started again when it
    is regained. Runs until cancelled (and then cancels `work` too). Work that ends by itself is logged and is
    started again only at the next regain of leadership."""
    task: asyncio.Future[None] | None = None
    try:
        while True:
            if election.is_leader and task is None:
                task = asyncio.ensure_future(work())
                task.add_done_callback(_log_end)
            elif not election.is_leader and task is not None:
                await _cancel(task)
                task = None
            await election.changed()
    finally:
        if task is not None:
            await _cancel(task)


async def _cancel(task: asyncio.Future[None]) -> None:
    task.cancel()
    await asyncio.wait([task])  # its outcome is not raised here: `_log_end` reports it


def _log_end(task: asyncio.Future[None]) -> None:
    if task.cancelled():
        return
    if (exc := task.exception()) is not None:
        _log.error("the leader's background work failed", exc_info=exc)
    else:
        _log.warning("the leader's background work ended by itself")


def _micro_time(epoch: float) -> str:
    """Kubernetes' MicroTime: RFC 3339 in UTC with microseconds."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None
