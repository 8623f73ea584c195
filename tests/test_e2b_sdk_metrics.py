"""Listing and metrics precision with the real `e2b` SDK: `started_after` and `get_metrics(start, end)`."""

from __future__ import annotations

import datetime
import uuid

from e2b import Sandbox, SandboxQuery

from tests.polling import wait_for
from tests.server_fixtures import RunningServer

CREATES = 20


def test_started_after_a_sandboxs_own_start_always_lists_it(e2b_env: RunningServer) -> None:
    tag = {"suite": f"started-after-{uuid.uuid4().hex}"}
    missed = []
    for _ in range(CREATES):
        sbx = Sandbox.create(metadata=tag, timeout=60)
        try:
            started = sbx.get_info().started_at
            listed = Sandbox.list(query=SandboxQuery(metadata=tag, started_after=started)).next_items()
            if sbx.sandbox_id not in [s.sandbox_id for s in listed]:
                missed.append(started)
        finally:
            sbx.kill()
    assert missed == []


def test_metrics_over_a_time_range_return_the_kept_samples(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        start = datetime.datetime.now(datetime.UTC)
        samples = wait_for(
            lambda: (found := sbx.get_metrics(start=start, end=datetime.datetime.now(datetime.UTC)))[2:] and found,
            what="three metrics samples",
        )
        stamps = [s.timestamp for s in samples]
        assert stamps == sorted(stamps)
        assert len(set(stamps)) == len(stamps)
        assert all(s.cpu_count >= 1 and s.mem_total > 0 for s in samples)
        newest = samples[-1].timestamp
        assert sbx.get_metrics(start=newest, end=newest)[-1].timestamp == newest  # `end` is the sample's second
    finally:
        sbx.kill()
