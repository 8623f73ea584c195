"""Both bounds on held requests, on a real server: past the cap 503 + Retry-After at once, past the deadline 504.

The server runs with `--max-held 3 --hold-deadline 0.02`: a restore takes far longer than 20 ms, so every held
request times out, and a burst of 50 leaves 47 over the cap. The target is the executor's own port, which
every kind of snapshot brings back. The restore goes on regardless and the sandbox then answers.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.polling import wait_for
from tests.scale_to_zero_fixtures import Reply, http_get, metric
from tests.server_fixtures import RunningServer, point_e2b_at, server_in_temp_dir

pytestmark = pytest.mark.anyio

ENVD = 49983


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with server_in_temp_dir(tmp_path_factory, "tight", "--max-held", "3", "--hold-deadline", "0.02") as server:
        yield server


@pytest.fixture
def paused(tight: RunningServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    point_e2b_at(tight, monkeypatch)
    sbx = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        assert sbx.pause()
        yield sbx
    finally:
        sbx.kill()


async def _gets(port: int, sandbox_id: str, count: int) -> list[Reply]:
    return list(await asyncio.gather(*(http_get(port, sandbox_id, "/health", port=ENVD) for _ in range(count))))


async def test_past_the_cap_503_with_retry_after_and_past_the_deadline_504(
    paused: Sandbox, tight: RunningServer
) -> None:
    replies = await _gets(tight.port, paused.sandbox_id, 50)
    statuses = Counter(reply.status for reply in replies)
    assert set(statuses) <= {503, 504, 204}, statuses
    assert statuses[503] >= 40
    assert statuses[504] >= 1
    assert all(reply.headers.get("retry-after") == "1" for reply in replies if reply.status == 503)
    assert metric(tight, "agent_sandbox_holds_total", result="queue_full") >= statuses[503]
    assert metric(tight, "agent_sandbox_holds_total", result="timeout") >= statuses[504]
    wait_for(lambda: paused.get_info().state == "running", what="the restore to finish without any waiter")
    assert (await http_get(tight.port, paused.sandbox_id, "/health", port=ENVD)).status == 204


async def test_a_paused_sandbox_without_auto_resume_is_not_held(
    tight: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_e2b_at(tight, monkeypatch)
    sbx = Sandbox.create()
    try:
        assert sbx.pause()
        held_before = sum(metric(tight, "agent_sandbox_holds_total", result=r) for r in ("resumed", "timeout"))
        reply = await http_get(tight.port, sbx.sandbox_id, "/health", port=ENVD)
        assert reply.status == 502
        assert b"was not found" in reply.body
        assert sum(metric(tight, "agent_sandbox_holds_total", result=r) for r in ("resumed", "timeout")) == held_before
        assert sbx.get_info().state == "paused"
    finally:
        sbx.kill()
