"""A sandbox whose pid 1 dies anyway is reported, not lost: with the real `e2b` SDK, it reads as paused (E2B's API has
no crashed state), its logs say why at level error, its files stay, a connect starts it again over them, and only a
kill removes them."""

from __future__ import annotations

import os
import signal

import httpx
from e2b import Sandbox

from tests.polling import wait_for
from tests.server_fixtures import RunningServer
from tests.test_e2b_sdk_pause_modes import executor_pid

KEPT = "/home/user/kept.txt"


def test_a_sandbox_whose_pid_one_dies_is_kept_paused_with_the_reason_and_comes_back_over_its_files(
    e2b_env: RunningServer,
) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write(KEPT, "written before the crash")
        os.kill(executor_pid(e2b_env, sbx.sandbox_id), signal.SIGKILL)
        wait_for(lambda: Sandbox.get_info(sbx.sandbox_id).state == "paused", what="the crash to be recorded")
        assert (e2b_env.data_dir / "sandboxes" / sbx.sandbox_id).is_dir()  # its files are kept
        logs = httpx.get(
            f"{e2b_env.url}/v2/sandboxes/{sbx.sandbox_id}/logs", headers={"X-API-Key": e2b_env.api_key}
        ).json()["logs"]
        [crash] = [entry for entry in logs if entry["message"].startswith("crashed: ")]
        assert crash["level"] == "error"
        assert "pid 1 (the executor) ended" in crash["message"]
        assert any(sandbox.sandbox_id == sbx.sandbox_id for sandbox in Sandbox.list().next_items())
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert resumed.files.read(KEPT) == "written before the crash"
        assert resumed.commands.run("echo alive").stdout == "alive\n"
    finally:
        sbx.kill()
    assert not (e2b_env.data_dir / "sandboxes" / sbx.sandbox_id).exists()
