"""E2B's lifecycle through the real SDK: pause snapshots, connect restores, auto-resume, on-timeout pause."""

from __future__ import annotations

import time

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from tests.polling import wait_for
from tests.scale_to_zero_fixtures import counted, criu_or_skip, http_get, start_counter
from tests.server_fixtures import RunningServer

pytestmark = pytest.mark.anyio


async def test_pause_and_connect_keep_files_and_a_background_process_memory(e2b_env: RunningServer) -> None:
    criu_or_skip(e2b_env)
    sbx = Sandbox.create(timeout=120)
    try:
        start_counter(sbx)
        sbx.files.write("/home/user/notes.txt", "written before the pause")
        assert (await http_get(e2b_env.port, sbx.sandbox_id, "/hit/x")).body == b"/hit/x 1"
        assert sbx.pause() is True
        assert sbx.pause() is False  # 409: already paused
        assert sbx.get_info().state == "paused"
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert resumed.get_info().state == "running"
        assert resumed.files.read("/home/user/notes.txt") == "written before the pause"
        # the count from before the pause is still in the server's memory
        assert (await http_get(e2b_env.port, sbx.sandbox_id, "/hit/x")).body == b"/hit/x 2"
        assert counted(e2b_env, sbx.sandbox_id)["heap"] == 8 << 20
    finally:
        sbx.kill()


def test_traffic_wakes_a_paused_sandbox_only_with_auto_resume(e2b_env: RunningServer) -> None:
    plain = Sandbox.create()
    waking = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        for sbx in (plain, waking):
            sbx.files.write("/home/user/kept.txt", sbx.sandbox_id)
            assert sbx.pause()
        assert waking.commands.run("cat /home/user/kept.txt").stdout == waking.sandbox_id  # woken by the call
        assert waking.get_info().state == "running"
        with pytest.raises(SandboxException, match=r"not found|502"):  # the SDK's error, not any failure
            plain.commands.run("true")
        assert plain.get_info().state == "paused"
    finally:
        plain.kill()
        waking.kill()


def test_a_timeout_pauses_when_asked_to_and_paused_time_does_not_count(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        sbx.files.write("/home/user/kept.txt", "survives its timeout")
        wait_for(lambda: sbx.get_info().state == "paused", what="the timeout to pause the sandbox")
        time.sleep(1.5)
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert resumed.files.read("/home/user/kept.txt") == "survives its timeout"
        assert resumed.get_info().end_at.timestamp() - time.time() > 55  # a fresh TTL, not one eaten by the pause
    finally:
        sbx.kill()


def test_a_pause_keeps_what_was_left_of_the_timeout(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=40)
    try:
        assert sbx.pause()
        time.sleep(3)
        Sandbox.connect(sbx.sandbox_id, timeout=5)  # shorter than what was left: what was left wins
        left = sbx.get_info().end_at.timestamp() - time.time()
        assert 36 < left <= 40
    finally:
        sbx.kill()
