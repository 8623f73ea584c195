"""What a timed-out `criu restore` leaves to read: the state of each task it and the sandbox had."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from pool._local._criu_sandbox import _task_states

pytestmark = pytest.mark.unit


def test_the_task_states_name_each_process_and_its_children_with_what_they_wait_on() -> None:
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until both sleep
            states = _task_states([parent.pid])
            summaries = [state.summary for state in states]
            if len(summaries) == 2 and all(" S " in summary for summary in summaries):
                break
            time.sleep(0.01)
        assert summaries[0].startswith(f"sh[{parent.pid}] S ")
        assert summaries[1].startswith("sleep[")
        assert " S " in summaries[1]
        assert "nanosleep" in summaries[1] or "nanosleep" in states[1].stack  # what sleep waits in
        assert all(state.stack for state in states)  # the kernel stack, or why it could not be read
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_a_task_that_ended_is_left_out() -> None:
    done = subprocess.Popen(["true"])
    done.wait()
    assert _task_states([done.pid]) == []
