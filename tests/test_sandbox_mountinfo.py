"""What a sandbox sees of its own mounts names no host path: its root overlay is made of layers bound at neutral
paths (`pool._local._launcher.root_mounts`), so the data directory, sandbox ids and image cache stay hidden, also
after a restore from CRIU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.runtime_fixtures import IMAGE_CACHE, local_runtime, require_criu, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio


async def test_mountinfo_inside_names_no_host_path(tmp_path: Path) -> None:
    require_criu()
    async with local_runtime(tmp_path) as rt:
        await rt.start(spec("hidden"))
        for when in ("started", "restored"):
            shown = await run_in_sandbox(rt, "hidden", "cat /proc/self/mountinfo")
            root = next(line for line in shown.stdout.splitlines() if " / / " in line)
            assert "lowerdir=/run/agent-sandbox/layers/0" in root, (when, root)
            for host_path in (str(tmp_path), str(IMAGE_CACHE), "hidden"):
                assert host_path not in shown.stdout, (when, host_path, shown.stdout)
            if when == "started":
                assert (await rt.snapshot("hidden")).kind == "criu"
                await rt.restore(spec("hidden"))
