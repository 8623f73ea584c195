"""A killed sandbox's processes are all gone, reaped, before its uid range is given to the next sandbox."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pool._local._orphans import reap_orphans

# Far above any slot's range, so no sandbox of a running test is touched.
_UIDS = range(3_000_000_000, 3_000_000_000 + 65536)


def _child_in_range(lives: float) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setresuid(_UIDS.start, _UIDS.start, _UIDS.start)
            time.sleep(lives)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 10
    while os.stat(f"/proc/{pid}").st_uid != _UIDS.start:  # it runs as the range's uid
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return pid


def _is_reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@pytest.mark.skipif(os.geteuid() != 0, reason="setresuid into a sandbox's range needs root")
def test_a_process_still_exiting_is_waited_for_and_reaped() -> None:
    pid = _child_in_range(0.3)  # alive when the reaping starts, as a pid 1 still exiting is
    assert reap_orphans(_UIDS)
    assert _is_reaped(pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="setresuid into a sandbox's range needs root")
def test_a_process_that_outlives_the_timeout_is_reported() -> None:
    pid = _child_in_range(60)
    try:
        assert not reap_orphans(_UIDS, timeout=0.2)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
