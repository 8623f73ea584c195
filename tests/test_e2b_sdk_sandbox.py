"""The real `e2b` SDK against `agent-sandbox serve`: lifecycle, listing, timeouts and ownership."""

from __future__ import annotations

import time

import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException

from tests.polling import wait_for
from tests.server_fixtures import RunningServer


def test_create_with_metadata_and_envs_reaches_the_sandbox(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(metadata={"owner": "alice"}, envs={"GREETING": "hello"}, timeout=120)
    try:
        assert sbx.get_info().metadata == {"owner": "alice"}
        assert sbx.commands.run("echo $GREETING").stdout == "hello\n"
    finally:
        sbx.kill()


def test_list_filters_by_metadata_and_state_across_pages(e2b_env: RunningServer) -> None:
    tag = f"list-{time.time_ns()}"
    boxes = [Sandbox.create(metadata={"suite": tag}) for _ in range(3)]
    try:
        boxes[0].pause()
        query = SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING, SandboxState.PAUSED])
        paginator = Sandbox.list(query=query, limit=2)
        first = paginator.next_items()
        more_after_first = paginator.has_next
        rest = paginator.next_items()
        assert len(first) == 2
        assert more_after_first
        assert not paginator.has_next
        assert {s.sandbox_id for s in first + rest} == {b.sandbox_id for b in boxes}
        running = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING])).next_items()
        assert {s.sandbox_id for s in running} == {b.sandbox_id for b in boxes[1:]}
    finally:
        for b in boxes:
            b.kill()


def test_set_timeout_and_expiry_kill_the_sandbox(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=60)
    sbx.set_timeout(2)
    end = sbx.get_info().end_at.timestamp()
    assert end - time.time() <= 3
    wait_for(lambda: not sbx.is_running(), what="the expiry to kill the sandbox")
    with pytest.raises(NotFoundException):
        sbx.get_info()


def test_kill_twice_returns_false_the_second_time(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create()
    assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id) is False


def test_connect_from_a_second_client_sees_the_same_files(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create()
    try:
        sbx.files.write("/home/user/shared.txt", "from the first client")
        other = Sandbox.connect(sbx.sandbox_id)
        assert other.files.read("/home/user/shared.txt") == "from the first client"
    finally:
        sbx.kill()


def test_wrong_key_is_refused(e2b_env: RunningServer) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 32)


def test_another_keys_sandbox_is_not_found(e2b_env: RunningServer) -> None:
    import subprocess
    import sys

    created = subprocess.run(
        [sys.executable, "-m", "cli", "keys", "create", "--name", "other", "--data-dir", str(e2b_env.data_dir)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    other_key = created.stdout.split()[0]
    sbx = Sandbox.create()
    try:
        with pytest.raises(SandboxException):
            Sandbox.connect(sbx.sandbox_id, api_key=other_key)
        assert Sandbox.kill(sbx.sandbox_id, api_key=other_key) is False
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_user_root_and_user_run_as_themselves(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create()
    try:
        assert sbx.commands.run("whoami").stdout.strip() == "user"
        assert sbx.commands.run("whoami", user="root").stdout.strip() == "root"
    finally:
        sbx.kill()
