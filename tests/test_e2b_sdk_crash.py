"""A sandbox whose pid 1 dies anyway is reported, not lost: with the real `e2b` SDK, it reads as paused (E2B's API has
no crashed state), its logs say why at level error, its files stay, a connect starts it again over them, and only a
kill removes them. The same when it dies while the server is down: the next start finds it so."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.polling import wait_for
from tests.server_fixtures import RunningServer, point_e2b_at, running_server
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
        assert "pid 1 (the executor) ended" in _crash_logged(e2b_env, sbx.sandbox_id)
        assert any(sandbox.sandbox_id == sbx.sandbox_id for sandbox in Sandbox.list().next_items())
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert resumed.files.read(KEPT) == "written before the crash"
        assert resumed.commands.run("echo alive").stdout == "alive\n"
    finally:
        sbx.kill()
    assert not (e2b_env.data_dir / "sandboxes" / sbx.sandbox_id).exists()


def test_a_sandbox_whose_pid_one_dies_while_the_server_is_down_is_found_crashed_with_its_files(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_server(data_dir) as first:
        point_e2b_at(first, monkeypatch)
        sbx = Sandbox.create(timeout=300)
        sbx.files.write(KEPT, "written before the crash")
        pid = executor_pid(first, sbx.sandbox_id)
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        os.kill(pid, signal.SIGKILL)  # while nothing watches it

        with running_server(data_dir) as second:
            point_e2b_at(second, monkeypatch)
            assert Sandbox.get_info(sbx.sandbox_id).state == "paused"
            assert "ended while the server was not running" in _crash_logged(second, sbx.sandbox_id)
            resumed = Sandbox.connect(sbx.sandbox_id)
            assert resumed.files.read(KEPT) == "written before the crash"
            resumed.kill()
            assert not (data_dir / "sandboxes" / sbx.sandbox_id).exists()


def _crash_logged(server: RunningServer, sandbox_id: str) -> str:
    """The sandbox's one `crashed: ...` log line, which must be at level error; its message."""
    logs = httpx.get(f"{server.url}/v2/sandboxes/{sandbox_id}/logs", headers={"X-API-Key": server.api_key})
    [crash] = [entry for entry in logs.json()["logs"] if entry["message"].startswith("crashed: ")]
    assert crash["level"] == "error"
    return str(crash["message"])
