"""A held burst: 1,000 HTTP requests and 100 WebSocket upgrades reach a snapshotted sandbox at once.

The sandbox runs a counting server and is scaled to zero (E2B pause, with auto-resume so traffic may wake it).
The first request starts one restore; the others are held until it finishes, then each is proxied exactly
once: the server in the sandbox counts every path, and nothing may be missing, doubled or failed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from e2b import Sandbox

from tests.scale_to_zero_fixtures import burst, counted, criu_or_skip, metric, start_counter
from tests.server_fixtures import RunningServer

pytestmark = pytest.mark.anyio

HTTP, WEBSOCKETS = 1000, 100


@pytest.fixture
def snapshotted(e2b_env: RunningServer) -> Iterator[Sandbox]:
    criu_or_skip(e2b_env)  # the counting server's memory must come back with it
    sbx = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True}, timeout=300)
    try:
        start_counter(sbx)
        assert sbx.pause()
        assert sbx.get_info().state == "paused"
        yield sbx
    finally:
        sbx.kill()


async def test_every_held_request_and_upgrade_is_answered_exactly_once(
    snapshotted: Sandbox, e2b_env: RunningServer
) -> None:
    activations_before = metric(e2b_env, "agent_sandbox_activations_total", result="ok")
    held_before = metric(e2b_env, "agent_sandbox_holds_total", result="resumed")
    replies, frames = await burst(e2b_env.port, snapshotted.sandbox_id, HTTP, WEBSOCKETS)

    assert Counter(reply.status for reply in replies) == {200: HTTP}
    assert sorted(reply.body for reply in replies) == sorted(f"/hit/{i} 1".encode() for i in range(HTTP))
    assert sorted(frames) == sorted(f"/ws/{i}".encode() for i in range(WEBSOCKETS))
    seen = counted(e2b_env, snapshotted.sandbox_id)
    assert seen["hits"] == {f"/hit/{i}": 1 for i in range(HTTP)}
    assert seen["upgrades"] == {f"/ws/{i}": 1 for i in range(WEBSOCKETS)}
    # one restore for the whole burst (single flight), and the sandbox runs again
    assert metric(e2b_env, "agent_sandbox_activations_total", result="ok") == activations_before + 1
    assert snapshotted.get_info().state == "running"
    held = metric(e2b_env, "agent_sandbox_holds_total", result="resumed") - held_before
    print(f"{held:.0f} of {HTTP + WEBSOCKETS} were held while the sandbox was restored")
    # Some of the burst really was held (alone, typically all of it). How many depends on how fast the gateway
    # parses 1,100 requests against how fast one restore is: in the full suite on 2 busy cores a 0.4 s restore
    # has won after 103 (stop 30), so the count is printed, and what is asserted is that holding happened at all.
    assert held >= 1
