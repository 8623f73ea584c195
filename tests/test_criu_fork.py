"""Forks of real sandboxes: one CRIU image of a running sandbox, restored into sandboxes of their own.

Needs the CRIU that `scripts/build-criu` installs (skipped without it, failed under CI=true).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
import pytest

from executor.envd import ENVD_PORT
from pool import LocalRuntime, Resources
from pool._errors import SandboxGone
from tests.runtime_fixtures import base_with, local_runtime, require_criu, sandbox_footprint, spec
from tests.sandbox_exec import run_in_sandbox
from tests.test_criu_snapshot import _count, _start_counter

pytestmark = pytest.mark.anyio


async def _start_source(rt: LocalRuntime) -> int:
    """The counter of `test_criu_snapshot` in a sandbox whose executor wants the token "source"; its pid inside."""
    count, server_pid = await _start_counter(rt, "source", token="source")
    assert count == 1
    return server_pid


async def _fork(rt: LocalRuntime, *names: str) -> None:
    image = await rt.fork_image("source", "source")
    try:
        for name in names:
            await rt.start(msgspec.structs.replace(spec(name, access_token=name), fork=image))
    finally:
        await rt.drop_fork_image(image)


async def _envs_status(rt: LocalRuntime, sandbox_id: str, token: str) -> int:
    """The status of envd's `GET /envs` (which needs the access token) with `token`."""
    reader, writer = await asyncio.open_connection(sock=await rt.open_socket(sandbox_id, ENVD_PORT))
    writer.write(f"GET /envs HTTP/1.0\r\nX-Access-Token: {token}\r\n\r\n".encode())
    status = (await reader.readline()).split()[1]
    writer.close()
    return int(status)


def _uid_range(data_dir: Path, sandbox_id: str) -> range:
    base = 100000 + int((data_dir / "sandboxes" / sandbox_id / "slot").read_text()) * 65536
    return range(base, base + 65536)


async def test_forks_go_on_from_the_sources_memory_each_on_its_own(tmp_path: Path) -> None:
    require_criu()
    async with local_runtime(tmp_path) as rt:
        server_pid = await _start_source(rt)
        await _fork(rt, "one", "two")
        assert not (tmp_path / "fork-images").exists() or not os.listdir(tmp_path / "fork-images")
        assert await _count(rt, "one") == (2, server_pid)  # the source's count went on in the fork's memory
        assert await _count(rt, "one") == (3, server_pid)
        assert await _count(rt, "two") == (2, server_pid)  # each fork counts on its own
        assert await _count(rt, "source") == (2, server_pid)  # and the source ran on as it was
        for name in ("source", "one", "two"):
            processes, _ = sandbox_footprint(tmp_path, name)
            assert processes, f"{name} runs no process in its own uid range"
        assert set(_uid_range(tmp_path, "one")).isdisjoint(_uid_range(tmp_path, "source"))


async def test_a_forks_files_are_a_copy_and_its_executor_takes_only_its_own_token(tmp_path: Path) -> None:
    require_criu()
    async with local_runtime(tmp_path) as rt:
        await _start_source(rt)
        await _fork(rt, "fork")
        read = await run_in_sandbox(rt, "fork", "cat ~/marker.txt; echo fork > ~/marker.txt; id -u", token="fork")
        assert read.stdout.split() == ["kept", "1000"]
        source = await run_in_sandbox(rt, "source", "cat ~/marker.txt", token="source")
        assert source.stdout.split() == ["kept"]
        assert [await _envs_status(rt, "fork", token) for token in ("fork", "source")] == [200, 401]
        assert await _envs_status(rt, "source", "source") == 200


async def test_a_fork_of_a_sandbox_that_does_not_run_is_refused(tmp_path: Path) -> None:
    require_criu()
    async with local_runtime(tmp_path) as rt:
        with pytest.raises(SandboxGone):
            await rt.fork_image("nothing", None)


async def test_a_fork_has_its_sources_limits_whatever_its_template_says_now(tmp_path: Path) -> None:
    require_criu()
    async with local_runtime(tmp_path) as rt:
        await rt.start(spec("source", base_with(memory_mb=768, pids=600), access_token="source"))
        image = await rt.fork_image("source", "source")
        try:
            await rt.start(msgspec.structs.replace(spec("fork", access_token="fork"), fork=image))
        finally:
            await rt.drop_fork_image(image)
        limits = msgspec.json.decode((tmp_path / "sandboxes" / "fork" / "resources.json").read_bytes(), type=Resources)
        assert (limits.memory_mb, limits.pids) == (768, 600)
