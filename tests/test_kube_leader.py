"""Leader election on a Lease of the dev cluster's real apiserver: one leader, takeover on crash and on release."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from pool._kube import KubeApi, load_kubeconfig
from pool._kube._leader import LeaderElection, while_leading
from tests import kube_fixtures
from tests.kube_fixtures import Kube
from tests.polling import wait_for_async

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

LEASE = 6.0  # seconds; renewed every LEASE / 3, often enough to hold on a loaded machine
RENEW = LEASE / 3


class Elector:
    """One replica's election and its `run()` task, which a test can crash (cancel) and start again."""

    def __init__(self, kubeconfig: Path, namespace: str, identity: str, lease: float) -> None:
        self.api = KubeApi(load_kubeconfig(kubeconfig))
        self.changes: list[bool] = []
        self.election = LeaderElection(
            self.api, namespace, identity=identity, lease_duration=lease, on_change=self.changes.append
        )
        self.task: asyncio.Task[None] | None = None

    def campaign(self) -> None:
        self.task = asyncio.create_task(self.election.run())

    async def crash(self) -> None:
        """Stop renewing without releasing the lease, as a killed process would."""
        assert self.task is not None
        self.task.cancel()
        await asyncio.wait([self.task])
        self.task = None


@contextlib.asynccontextmanager
async def electors(kube: Kube, namespace: str, *names: str, lease: float = LEASE) -> AsyncIterator[list[Elector]]:
    started = [Elector(kube.kubeconfig, namespace, name, lease) for name in names]
    try:
        yield started
    finally:
        for elector in started:
            if elector.task is not None:
                await elector.crash()
            await elector.api.aclose()


async def seconds_until(condition: Callable[[], bool], *, what: str) -> float:
    """How long it took for `condition` to hold."""
    began = time.monotonic()
    await wait_for_async(condition, what=what)
    return time.monotonic() - began


def leaders(group: list[Elector]) -> list[Elector]:
    return [e for e in group if e.election.is_leader]


async def test_exactly_one_of_two_electors_leads(kube: Kube, kube_namespace: str) -> None:
    async with electors(kube, kube_namespace, "a", "b") as group:
        for elector in group:
            elector.campaign()
        await wait_for_async(lambda: len(leaders(group)) == 1, what="a leader")
        for _ in range(round(3 * LEASE / 0.05)):  # through several renewals
            assert len(leaders(group)) == 1
            await asyncio.sleep(0.05)
        assert sorted(len(e.changes) for e in group) == [0, 1]  # nobody stepped down or took over meanwhile


async def test_the_other_takes_over_within_the_lease_when_the_leader_crashes(kube: Kube, kube_namespace: str) -> None:
    async with electors(kube, kube_namespace, "a", "b") as (a, b):
        a.campaign()
        await wait_for_async(lambda: a.election.is_leader, what="a leading")
        b.campaign()
        await asyncio.sleep(RENEW * 2)
        assert not b.election.is_leader
        await a.crash()
        assert not a.election.is_leader
        took = await seconds_until(lambda: b.election.is_leader, what="b taking over")
        assert took < 2 * LEASE, took  # once a's lease ran out (a renewal or two of b's late at most)


async def test_the_other_takes_over_at_once_when_the_leader_releases(kube: Kube, kube_namespace: str) -> None:
    lease, renew = 30.0, 10.0  # unreleased, the lease would stay taken for 20 s or more after the leader stops

    async with electors(kube, kube_namespace, "a", "b", lease=lease) as (a, b):
        a.campaign()
        await wait_for_async(lambda: a.election.is_leader, what="a leading")
        b.campaign()
        await a.crash()
        assert not b.election.is_leader  # the lease is still a's: only its release can hand it over
        await a.election.release()
        took = await seconds_until(lambda: b.election.is_leader, what="b taking over")
        assert took < lease - renew, took  # at b's next try, not once the lease has expired


async def test_work_runs_only_while_leading(kube: Kube, kube_namespace: str) -> None:
    running: set[str] = set()

    def work_of(name: str) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            running.add(name)
            try:
                await asyncio.Event().wait()
            finally:
                running.discard(name)

        return work

    async with electors(kube, kube_namespace, "a", "b") as (a, b):
        workers = [asyncio.create_task(while_leading(e.election, work_of(n))) for e, n in ((a, "a"), (b, "b"))]
        a.campaign()
        await wait_for_async(lambda: running == {"a"}, what="a's work")
        b.campaign()
        await a.crash()
        await wait_for_async(lambda: running == set(), what="a's work cancelled")
        await wait_for_async(lambda: running == {"b"}, what="b's work")
        a.campaign()  # a comes back: b still leads
        await asyncio.sleep(RENEW * 2)
        assert running == {"b"}
        assert not a.election.is_leader
        await b.crash()
        await b.election.release()
        await wait_for_async(lambda: running == {"a"}, what="a's work started again")
        for worker in workers:
            worker.cancel()
        await asyncio.wait(workers)
        assert running == set()
