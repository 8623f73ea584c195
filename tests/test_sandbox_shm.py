"""`/dev/shm` in a local sandbox: a tmpfs every user may write, half the sandbox's memory at most 1 GiB, and what
it holds counts in the sandbox's memory (Chromium and Python's multiprocessing need it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pool import LocalRuntime
from pool._local._launcher import shm_size
from tests.runtime_fixtures import TEMPLATES, local_runtime, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    async with local_runtime(tmp_path) as runtime:
        yield runtime


def test_shm_is_half_the_memory_and_at_most_a_gibibyte() -> None:
    assert shm_size(1024) == 512 << 20
    assert shm_size(8192) == 1 << 30


async def test_user_writes_shared_memory_and_it_counts_in_the_sandboxs_memory(rt: LocalRuntime) -> None:
    await rt.start(spec("shm1"))
    shown = await run_in_sandbox(rt, "shm1", "stat -c '%a %U' /dev/shm; df -B1 --output=size /dev/shm | tail -1")
    mode, size = shown.stdout.splitlines()
    assert mode == "1777 root"
    assert int(size) == shm_size(TEMPLATES["base"].resources.memory_mb)
    before = (await rt.stats("shm1")).mem_used
    python = "from multiprocessing import shared_memory as s; s.SharedMemory(create=True, size=4096)"
    shared = await run_in_sandbox(rt, "shm1", f"python3 -c '{python}'")
    assert shared.exit_code == 0, shared
    made = await run_in_sandbox(rt, "shm1", "head -c 64M /dev/zero > /dev/shm/fill && ls /dev/shm")
    assert made.stdout.split() == ["fill"], made
    assert (await rt.stats("shm1")).mem_used - before >= 60 << 20  # charged to the sandbox
    too_big = await run_in_sandbox(rt, "shm1", f"head -c {shm_size(1024) + (1 << 20)} /dev/zero > /dev/shm/big")
    assert too_big.exit_code != 0
    assert "No space left on device" in too_big.stderr
