"""POST /agent-sandbox/freeze and /thaw: every descendant of the executor stops and continues; the executor answers."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import PtySize
from e2b.sandbox_sync.commands.command_handle import CommandHandle

from tests.executor_fixtures import Envd, run_executor
from tests.polling import wait_for

FREEZE = "/agent-sandbox/freeze"
THAW = "/agent-sandbox/thaw"
LOOP = "while :; do echo x >> {}; sleep 0.02; done"


@pytest.fixture(name="executor")
def executor_fixture() -> Iterator[Envd]:
    """An executor of its own: a failed test must not leave another test's processes stopped."""
    with run_executor() as running:
        yield running


def _start(executor: Envd, command: str, home: Path) -> CommandHandle:
    """Run `command` in the background with HOME elsewhere: the host's ~/.bashrc (pyenv's rehash takes a lock that
    a stopped or killed shell would hold on to) stays out of the way."""
    return executor.sandbox().commands.run(command, background=True, envs={"HOME": str(home)})


def _state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ("S", "R", "T", "Z"…); "gone" once it is gone."""
    try:
        line = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return "gone"
    return line[line.rfind(b")") + 2 :].split(b" ", 1)[0].decode()


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it, parents first."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = Path(f"/proc/{name}/stat").read_bytes()
        except FileNotFoundError:
            continue
        children.setdefault(int(line[line.rfind(b")") + 2 :].split(b" ", 2)[1]), []).append(int(name))
    found = [pid]
    for parent in found:  # the list grows while it is walked
        found.extend(children.get(parent, []))
    return found


def _sizes(*paths: Path) -> list[int]:
    return [path.stat().st_size if path.exists() else 0 for path in paths]


def test_freeze_stops_a_writing_loop_and_the_children_it_forked_until_thaw(executor: Envd, tmp_path: Path) -> None:
    child, grandchild = tmp_path / "child.log", tmp_path / "grandchild.log"
    handle = _start(executor, f"({LOOP.format(grandchild)}) & {LOOP.format(child)}", tmp_path)
    wait_for(lambda: all(_sizes(child, grandchild)), what="both loops to write")
    with executor.client() as client:
        assert client.post(FREEZE).status_code == 204
        tree = _tree(handle.pid)
        assert len(tree) >= 2  # the loop and the subshell it forked
        assert {_state(pid) for pid in tree} <= {"T", "Z", "gone"}  # a `sleep` may have ended unreaped
        assert _state(handle.pid) == "T"
        before = _sizes(child, grandchild)
        time.sleep(0.5)
        assert _sizes(child, grandchild) == before
        assert client.get("/health").status_code == 204
        state = client.get(FREEZE).json()
        assert state["frozen"] is True
        assert state["stopped"] >= 2
        assert client.post(THAW).status_code == 204
        wait_for(
            lambda: all(now > then for now, then in zip(_sizes(child, grandchild), before, strict=True)),
            what="both loops to write again",
        )
        assert _state(handle.pid) != "T"
        assert client.get(FREEZE).json() == {"frozen": False, "stopped": 0}
    handle.kill()


def _pty_until(events: Iterator[Any], marker: str) -> str:
    """Consume PTY output until `marker` has been seen."""
    seen = ""
    for _, _, pty in events:
        seen += (pty or b"").decode(errors="replace")
        if marker in seen:
            return seen
    raise AssertionError(f"{marker!r} never arrived; got {seen!r}")


def test_an_interactive_shell_keeps_its_foreground_job_across_freeze_and_thaw(executor: Envd, tmp_path: Path) -> None:
    sandbox = executor.sandbox()
    handle = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ ", "HOME": str(tmp_path)})
    events = iter(handle)
    sandbox.pty.send_stdin(handle.pid, b"cat\n")
    wait_for(lambda: len(_tree(handle.pid)) == 2, what="cat in the foreground")  # the shell and cat, in the foreground
    with executor.client() as client:
        assert client.post(FREEZE).status_code == 204
        assert {_state(pid) for pid in _tree(handle.pid)} == {"T"}
        assert client.post(THAW).status_code == 204
    sandbox.pty.send_stdin(handle.pid, b"still cat\n")
    seen = _pty_until(events, "still cat\r\nstill cat")  # the terminal's echo, then cat's copy: cat got the line
    sandbox.pty.send_stdin(handle.pid, b"\x04exit 0\n")
    assert handle.wait().exit_code == 0
    assert "Stopped" not in seen


def test_freezing_twice_and_thawing_twice_is_harmless(executor: Envd, tmp_path: Path) -> None:
    handle = _start(executor, LOOP.format(tmp_path / "loop.log"), tmp_path)
    wait_for(lambda: all(_sizes(tmp_path / "loop.log")), what="the loop to write")
    with executor.client() as client:
        assert [client.post(FREEZE).status_code for _ in range(2)] == [204, 204]
        assert _state(handle.pid) == "T"
        assert client.get(FREEZE).json()["frozen"] is True
        assert [client.post(THAW).status_code for _ in range(2)] == [204, 204]
        assert client.get(FREEZE).json() == {"frozen": False, "stopped": 0}
    wait_for(lambda: _state(handle.pid) != "T", what="the loop to run again")
    handle.kill()


def test_processes_started_while_frozen_run(executor: Envd, tmp_path: Path) -> None:
    with executor.client() as client:
        assert client.post(FREEZE).status_code == 204
        result = executor.sandbox().commands.run("echo started while frozen", envs={"HOME": str(tmp_path)})
        assert result.stdout == "started while frozen\n"
        assert client.post(THAW).status_code == 204


def test_thaw_continues_a_process_stopped_by_someone_else(executor: Envd, tmp_path: Path) -> None:
    handle = _start(executor, LOOP.format(tmp_path / "loop.log"), tmp_path)
    wait_for(lambda: all(_sizes(tmp_path / "loop.log")), what="the loop to write")
    executor.sandbox().commands.run(f"kill -STOP {handle.pid}", envs={"HOME": str(tmp_path)})
    wait_for(lambda: _state(handle.pid) == "T", what="the loop to stop")
    with executor.client() as client:
        assert client.post(THAW).status_code == 204
    wait_for(lambda: _state(handle.pid) != "T", what="the loop to continue")
    handle.kill()


@pytest.mark.parametrize(("method", "path"), [("POST", FREEZE), ("GET", FREEZE), ("POST", THAW)])
def test_freeze_and_thaw_refuse_a_wrong_token(executor: Envd, method: str, path: str) -> None:
    with executor.client(**{"X-Access-Token": "wrong"}) as client:
        response = client.request(method, path)
    assert response.status_code == 401
    assert response.json()["code"] == 401
