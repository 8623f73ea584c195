"""Files-only snapshots (no CRIU): the writable layer stays, processes end, a restore starts the template again.

The runtime here has CRIU turned off (`criu_dir=None`), as on a machine without a working CRIU.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from pool import ExecutorInit, LocalRuntime, RuntimeFailure, SandboxGone, SandboxSpec
from tests.polling import wait_for_async
from tests.runtime_fixtures import TEMPLATES, http_get, local_runtime, sandbox_footprint
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

# A template whose start command counts its runs in a file and serves the home directory on port 8008.
SERVED = msgspec.structs.replace(
    TEMPLATES["base"],
    start=("echo started >> ~/starts && exec python3 -m http.server 8008 --bind 127.0.0.1 --directory ~",),
    ports=(8008,),
)
_TOKEN = "secret-token"


def served(sandbox_id: str) -> SandboxSpec:
    init = ExecutorInit(env_vars={"GREETING": "hello"}, access_token=_TOKEN, default_user="user")
    return SandboxSpec(sandbox_id=sandbox_id, template=SERVED, init=init)


async def _run(tmp_path: Path, scenario: Callable[[LocalRuntime], Awaitable[None]]) -> None:
    async with local_runtime(tmp_path, criu=False) as rt:
        await scenario(rt)


async def test_snapshot_keeps_files_and_restore_reruns_init_and_start_commands(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(served("files"))
        assert await http_get(rt, "files", 8008, "/starts") == b"started\n"  # start waited for the port
        assert (await run_in_sandbox(rt, "files", "echo mine > ~/note", token=_TOKEN)).exit_code == 0
        assert (await run_in_sandbox(rt, "files", "echo etc >> /etc/motd", user="root", token=_TOKEN)).exit_code == 0
        info = await rt.snapshot("files")
        assert info.kind == "filesystem"
        assert rt.is_snapshotted("files")
        assert not rt.is_running("files")
        assert sandbox_footprint(tmp_path, "files") == ([], [])  # no process, no cgroup, so no RAM
        with pytest.raises(SandboxGone):
            await rt.open_socket("files", 8008)
        await rt.restore(served("files"))
        assert await http_get(rt, "files", 8008, "/starts") == b"started\nstarted\n"
        assert await http_get(rt, "files", 8008, "/note") == b"mine\n"
        after = await run_in_sandbox(rt, "files", "echo $GREETING; tail -1 /etc/motd", token=_TOKEN)
        assert after.stdout.split() == ["hello", "etc"]

    await _run(tmp_path, scenario)


async def test_a_frozen_sandbox_is_snapshotted_and_comes_back_thawed(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(served("frozen"))
        await rt.freeze("frozen")
        assert (await rt.snapshot("frozen")).kind == "filesystem"
        assert sandbox_footprint(tmp_path, "frozen") == ([], [])
        await rt.restore(served("frozen"))
        assert not rt.is_frozen("frozen")
        assert await http_get(rt, "frozen", 8008, "/starts") == b"started\nstarted\n"

    await _run(tmp_path, scenario)


async def test_only_a_sandbox_running_nothing_but_its_template_keeps_its_processes(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(served("census"))
        assert rt.capabilities().snapshot_kind == "filesystem"
        finished = await run_in_sandbox(rt, "census", "sleep 0.1", token=_TOKEN)  # ended: loses nothing
        assert finished.exit_code == 0
        # A process that ended is reaped by the executor a moment later: the census counts it until then.
        await wait_for_async(lambda: rt.snapshot_keeps_processes("census"), what="the finished command to be reaped")
        await run_in_sandbox(rt, "census", "(setsid sleep 600 </dev/null >/dev/null 2>&1 &)", token=_TOKEN)
        assert not rt.snapshot_keeps_processes("census")  # a process of the user's would be lost
        await run_in_sandbox(rt, "census", "pkill -x sleep", token=_TOKEN)
        # A process that ended is reaped by the executor a moment later: the census counts it until then.
        await wait_for_async(lambda: rt.snapshot_keeps_processes("census"), what="the killed sleep to be reaped")
        await rt.snapshot("census")
        assert rt.snapshot_keeps_processes("census")  # nothing left to lose

    await _run(tmp_path, scenario)


async def test_snapshot_and_restore_are_idempotent_and_say_what_is_wrong(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        with pytest.raises(SandboxGone):
            await rt.restore(served("never"))
        with pytest.raises(SandboxGone):
            await rt.snapshot("never")
        await rt.start(served("twice"))
        first = await rt.snapshot("twice")
        assert await rt.snapshot("twice") == first
        with pytest.raises(RuntimeFailure, match="snapshotted"):
            await rt.start(served("twice"))
        await rt.restore(served("twice"))
        await rt.restore(served("twice"))
        assert rt.is_running("twice")
        assert await http_get(rt, "twice", 8008, "/starts") == b"started\nstarted\n"
        await rt.snapshot("twice")
        await rt.stop("twice")
        assert not rt.is_snapshotted("twice")
        assert not (tmp_path / "sandboxes" / "twice").exists()

    await _run(tmp_path, scenario)
