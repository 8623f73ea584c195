"""`pause(mode="filesystem")`, `connect(on_resume="reboot")` and `pause(strict=True)` with the real `e2b` SDK."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from e2b import Sandbox, ServiceBusyException

from tests.polling import wait_for
from tests.runtime_fixtures import sandbox_footprint
from tests.scale_to_zero_fixtures import criu_or_skip
from tests.server_fixtures import RunningServer

KEPT = "/home/user/kept.txt"


def started_with_a_process_and_a_file() -> Sandbox:
    sbx = Sandbox.create(timeout=300)
    sbx.commands.run("sleep 1000", background=True)
    sbx.files.write(KEPT, "written before the pause")
    # `sleep` is a bash -l first: it shows under its own name once the login shell has run its profile and exec'd
    wait_for(lambda: sleeping(sbx), what="the background sleep to run")
    return sbx


def sleeping(sbx: Sandbox) -> bool:
    return sbx.commands.run("pgrep -x sleep || true").stdout.strip() != ""


def test_a_filesystem_pause_drops_processes_and_keeps_files(e2b_env: RunningServer) -> None:
    sbx = started_with_a_process_and_a_file()
    try:
        assert sbx.pause(mode="filesystem")
        resumed = Sandbox.connect(sbx.sandbox_id)
        assert not sleeping(resumed)
        assert resumed.files.read(KEPT) == "written before the pause"
    finally:
        sbx.kill()


def test_a_reboot_resume_drops_the_memory_of_a_full_pause(e2b_env: RunningServer) -> None:
    sbx = started_with_a_process_and_a_file()
    try:
        assert sbx.pause()
        resumed = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
        assert not sleeping(resumed)
        assert resumed.files.read(KEPT) == "written before the pause"
    finally:
        sbx.kill()


def test_a_full_pause_keeps_processes_where_criu_works(e2b_env: RunningServer) -> None:
    criu_or_skip(e2b_env)
    sbx = started_with_a_process_and_a_file()
    try:
        assert sbx.pause()
        assert sleeping(Sandbox.connect(sbx.sandbox_id))
    finally:
        sbx.kill()


def test_a_strict_pause_of_a_healthy_sandbox_pauses_it(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        assert sbx.pause(strict=True)
        assert sbx.get_info().state == "paused"
    finally:
        sbx.kill()


def test_a_strict_pause_of_a_sandbox_whose_executor_hangs_leaves_it_running(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=120)
    executor = executor_pid(e2b_env, sbx.sandbox_id)
    os.kill(executor, signal.SIGSTOP)  # it still accepts connections (the kernel does) but answers nothing
    try:
        with pytest.raises(ServiceBusyException, match="executor did not answer"):
            Sandbox.pause(sbx.sandbox_id, strict=True, request_timeout=120)
        assert Sandbox.get_info(sbx.sandbox_id).state == "running"
    finally:
        os.kill(executor, signal.SIGCONT)
        sbx.kill()


def executor_pid(server: RunningServer, sandbox_id: str) -> int:
    """The host pid of the sandbox's executor (its pid 1, which nothing inside the sandbox may stop)."""
    processes, _ = sandbox_footprint(server.data_dir, sandbox_id)
    argv = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in processes}
    [pid] = [
        pid
        for pid, args in argv.items()
        if args[0].endswith(b"python3") and any(b"run-executor" in arg for arg in args)
    ]
    return pid
