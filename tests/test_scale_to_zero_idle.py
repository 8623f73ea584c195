"""The idle policy on a real server (`--pause-after 1 --snapshot-after 2`): transparent to E2B, woken by traffic.

The module's server runs one sandbox at a time, so its health counts say which state that sandbox is in.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState

from tests.polling import wait_for
from tests.scale_to_zero_fixtures import criu_or_skip, http_get, sandboxes_by_state, start_counter
from tests.server_fixtures import RunningServer, point_e2b_at, server_in_temp_dir

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def idle_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with server_in_temp_dir(tmp_path_factory, "idle", "--pause-after", "1", "--snapshot-after", "2") as server:
        yield server


@pytest.fixture
def idle_env(idle_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> RunningServer:
    return point_e2b_at(idle_server, monkeypatch)


def _in(server: RunningServer, state: str) -> bool:
    return sandboxes_by_state(server)[state] == 1


async def test_an_idle_sandbox_freezes_then_snapshots_and_still_reads_as_running(idle_env: RunningServer) -> None:
    criu_or_skip(idle_env)
    sbx = Sandbox.create(timeout=120)
    try:
        start_counter(sbx)
        first = await http_get(idle_env.port, sbx.sandbox_id, "/hit/a")
        wait_for(lambda: _in(idle_env, "paused"), what="the idle freeze")
        assert sbx.get_info().state == "running"  # transparent
        wait_for(lambda: _in(idle_env, "snapshotted"), what="the idle snapshot")
        listed = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
        assert sbx.sandbox_id in {s.sandbox_id for s in listed}
        second = await http_get(idle_env.port, sbx.sandbox_id, "/hit/a")  # wakes it: restore
        assert (first.body, second.body) == (b"/hit/a 1", b"/hit/a 2")  # its memory came back
        assert _in(idle_env, "running")
    finally:
        sbx.kill()


def test_a_running_command_is_not_paused_under_its_caller(idle_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        began = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            command = pool.submit(sbx.commands.run, "sleep 4; echo finished")
            states: list[dict[str, int]] = []
            while not command.done():  # well past `--pause-after 1`: an idle pause would show in these counts
                states.append(sandboxes_by_state(idle_env))
                time.sleep(0.2)
            result = command.result()
        assert result.stdout == "finished\n"
        assert time.monotonic() - began < 30  # not held up by a pause of its sandbox
        assert len(states) >= 4  # samples over its 4 s, however slowly /health answers
        assert all(counts["running"] == 1 for counts in states), states  # never paused while it ran
    finally:
        sbx.kill()


def test_api_calls_wake_an_idle_sandbox(idle_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "still here")
        wait_for(lambda: _in(idle_env, "snapshotted") or _in(idle_env, "paused"), what="an idle pause")
        assert sbx.files.read("/home/user/kept.txt") == "still here"
        assert sbx.commands.run("echo awake").stdout == "awake\n"
        assert _in(idle_env, "running")  # the calls woke it
    finally:
        sbx.kill()


def test_its_timeout_still_runs_while_idle(idle_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=5)
    wait_for(lambda: not _in(idle_env, "running"), what="an idle pause")
    wait_for(lambda: not sbx.is_running(), what="the timeout")
    assert httpx.get(f"{idle_env.url}/health").json()["sandboxes"] == {"running": 0, "paused": 0, "snapshotted": 0}
