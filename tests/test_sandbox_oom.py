"""A sandbox cannot kill itself by accident: its pid 1 (the executor) is the OOM killer's last choice, and every
process it starts is an ordinary candidate again, so filling memory and /dev/shm kills the offender, not the
sandbox (which took its files with it before)."""

from __future__ import annotations

import os
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from executor._spawn import CHILD_OOM_SCORE_ADJ
from pool import LocalRuntime, Template
from tests.runtime_fixtures import base_with, local_runtime, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

MEMORY_MB = 256


def _small_memory() -> Template:
    return base_with(memory_mb=MEMORY_MB)


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    async with local_runtime(tmp_path, criu=False) as runtime:
        yield runtime


async def test_pid_one_is_the_last_choice_and_every_process_it_starts_the_first(rt: LocalRuntime) -> None:
    await rt.start(spec("scored"))
    assert Path(f"/proc/{rt.host_pid('scored')}/oom_score_adj").read_text().strip() == "0"
    first = str(CHILD_OOM_SCORE_ADJ)
    # The executor writes the value just after the fork (`executor._spawn`): each command reads its own shell's
    # once that has surely happened, and so does a child forked then, which inherits it.
    own_and_child = "sleep 1; cat /proc/$$/oom_score_adj; sh -c 'cat /proc/$$/oom_score_adj'"
    for user in ("user", "root"):
        shown = await run_in_sandbox(rt, "scored", own_and_child, user=user)
        assert shown.stdout.split() == [first, first], shown
    sudo = await run_in_sandbox(rt, "scored", f"sudo sh -c {shlex.quote(own_and_child)}")
    assert sudo.stdout.split() == [first, first], sudo


async def test_filling_shm_and_memory_kills_the_offender_and_the_sandbox_lives_on(rt: LocalRuntime) -> None:
    await rt.start(spec("hogged", _small_memory()))
    pid_one = rt.host_pid("hogged")
    # /dev/shm full (half the memory, charged to the sandbox), then many small processes, each smaller than the
    # executor: without its protection the executor is the biggest process and the OOM killer's choice.
    hog = (
        "head -c 120M /dev/zero > /dev/shm/fill; "
        "for i in $(seq 40); do python3 -c 'import time; b = bytearray(6 << 20); time.sleep(30)' & done; wait"
    )
    await run_in_sandbox(rt, "hogged", hog)
    events = dict(line.split() for line in _memory_events(rt, "hogged").splitlines())
    assert int(events["oom_kill"]) >= 1
    assert rt.host_pid("hogged") == pid_one
    after = await run_in_sandbox(rt, "hogged", "rm /dev/shm/fill && echo alive")
    assert after.stdout == "alive\n"


def _memory_events(rt: LocalRuntime, sandbox_id: str) -> str:
    pid = rt.host_pid(sandbox_id)
    relative = next(
        line.split(":", 2)[2]
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        if line.startswith("0::") or ":memory:" in line
    )
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory"):
        events = Path(root + relative) / "memory.events"
        if events.exists():
            return events.read_text()
    oom = Path("/sys/fs/cgroup/memory" + relative) / "memory.oom_control"
    return oom.read_text() if oom.exists() else os.strerror(2)
