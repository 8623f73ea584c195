"""A restarted server (a new runtime on the same data directory) finds its sandboxes and what a crash left.

The first runtime is dropped without stopping anything, as a killed server would be; its event loop is
gone, so nothing of it reacts to what the second one does. Only its launchers (bubblewrap's outer process)
stay this process's children, where a killed server's would go to init: the tests reap them at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.runtime_fixtures import http_get, local_runtime, new_runtime, require_criu, runtime_settings
from tests.sandbox_exec import run_in_sandbox
from tests.test_snapshot_filesystem import SERVED, served

pytestmark = pytest.mark.anyio


@pytest.fixture
def launchers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The abandoned runtimes' launchers, reaped once the restarted runtime has stopped their sandboxes."""
    found: list[subprocess.Popen[bytes]] = []
    yield found
    for process in found:
        process.wait(10)


async def _before_the_crash(
    tmp_path: Path, criu: bool, sandbox_id: str, launchers: list[subprocess.Popen[bytes]], *, snapshot: bool
) -> None:
    """A runtime starts a sandbox (and snapshots it), then is abandoned like a killed server: in an event loop of
    its own, which ends with it (what it left running must not live on in the test's loop)."""

    async def doomed() -> None:
        rt = new_runtime(runtime_settings(tmp_path, criu=criu))
        await asyncio.to_thread(rt.images.build, SERVED, lambda _line: None)  # no-op when built
        await rt.start(served(sandbox_id))
        await run_in_sandbox(rt, sandbox_id, "echo mine > ~/note", token="secret-token")
        if snapshot:
            await rt.snapshot(sandbox_id)
        launchers.extend(box.process for box in rt._sandboxes.values() if box.process is not None)
        rt.close()

    await asyncio.to_thread(asyncio.run, doomed())


@pytest.mark.parametrize("criu", [True, False], ids=["criu", "filesystem"])
async def test_a_restarted_runtime_finds_a_snapshotted_sandbox_and_restores_it_with_its_files(
    tmp_path: Path, criu: bool, launchers: list[subprocess.Popen[bytes]]
) -> None:
    if criu:
        require_criu()
    await _before_the_crash(tmp_path, criu, "kept", launchers, snapshot=True)

    async with local_runtime(tmp_path, criu=criu) as rt:
        assert await rt.recover() == set()
        assert rt.snapshotted_ids() == {"kept"}
        await rt.restore(served("kept"))
        assert await http_get(rt, "kept", 8008, "/note") == b"mine\n"
        starts = await http_get(rt, "kept", 8008, "/starts")
        assert starts == (b"started\n" if criu else b"started\nstarted\n")  # CRIU kept the server running


async def test_a_memory_snapshot_cut_off_by_a_crash_keeps_the_processes_and_discards_the_half_image(
    tmp_path: Path, launchers: list[subprocess.Popen[bytes]]
) -> None:
    await _before_the_crash(tmp_path, False, "half", launchers, snapshot=False)
    directory = tmp_path / "sandboxes" / "half"
    # What a crash in the middle of a CRIU dump leaves: the intent recorded, half an image, processes alive.
    (directory / "snapshot.json").write_text('{"kind": "criu", "seconds": 0.0, "image_bytes": 0}')
    (directory / "checkpoint.new").mkdir()
    (directory / "checkpoint.new" / "pages-1.img").write_bytes(b"\0" * 4096)

    async with local_runtime(tmp_path, criu=False) as rt:
        assert await rt.recover() == {"half"}  # running on (the activator snapshots it again), not files only
        assert rt.snapshotted_ids() == set()
        assert not (directory / "checkpoint.new").exists()
        assert not (directory / "snapshot.json").exists()
        assert await http_get(rt, "half", 8008, "/starts") == b"started\n"  # the same processes: no second start
        assert await http_get(rt, "half", 8008, "/note") == b"mine\n"


async def test_a_files_only_snapshot_interrupted_by_a_crash_is_finished_after_the_restart(
    tmp_path: Path, launchers: list[subprocess.Popen[bytes]]
) -> None:
    await _before_the_crash(tmp_path, False, "half", launchers, snapshot=False)
    directory = tmp_path / "sandboxes" / "half"
    (directory / "snapshot.json").write_text('{"kind": "filesystem", "seconds": 0.0, "image_bytes": 0}')

    async with local_runtime(tmp_path, criu=False) as rt:
        assert await rt.recover() == set()
        assert rt.snapshotted_ids() == {"half"}
        await rt.restore(served("half"))
        assert await http_get(rt, "half", 8008, "/note") == b"mine\n"


async def test_a_running_sandbox_is_readopted_with_its_start_commands_known(
    tmp_path: Path, launchers: list[subprocess.Popen[bytes]]
) -> None:
    await _before_the_crash(tmp_path, False, "alive", launchers, snapshot=False)
    stale = tmp_path / "sandboxes" / "alive" / "checkpoint"
    stale.mkdir()  # what a crash right after a complete restore leaves
    (stale / "inventory.img").write_bytes(b"stale")

    async with local_runtime(tmp_path, criu=False) as rt:
        assert await rt.recover() == {"alive"}
        assert await http_get(rt, "alive", 8008, "/note") == b"mine\n"
        assert not stale.exists()
        assert rt.snapshot_keeps_processes("alive")  # the start command's server is still the template's
        assert (await rt.snapshot("alive")).kind == "filesystem"


async def test_a_dump_complete_but_not_yet_in_place_is_kept_after_the_restart(
    tmp_path: Path, launchers: list[subprocess.Popen[bytes]]
) -> None:
    require_criu()
    await _before_the_crash(tmp_path, True, "dumped", launchers, snapshot=True)
    directory = tmp_path / "sandboxes" / "dumped"
    (directory / "checkpoint").rename(directory / "checkpoint.new")  # the crash came before the rename

    async with local_runtime(tmp_path) as rt:
        assert await rt.recover() == set()
        assert rt.snapshotted_ids() == {"dumped"}
        await rt.restore(served("dumped"))
        assert await http_get(rt, "dumped", 8008, "/starts") == b"started\n"  # memory kept: no second start


async def test_a_sandbox_whose_pid_one_died_while_no_server_ran_keeps_its_files_and_says_why(
    tmp_path: Path, launchers: list[subprocess.Popen[bytes]]
) -> None:
    await _before_the_crash(tmp_path, False, "dead", launchers, snapshot=False)
    directory = tmp_path / "sandboxes" / "dead"
    os.kill(int((directory / "pid").read_text()), signal.SIGKILL)
    launchers[0].wait(10)  # its launcher ends with it: nothing of the sandbox runs

    async with local_runtime(tmp_path, criu=False) as rt:
        assert await rt.recover() == set()
        assert rt.snapshotted_ids() == {"dead"}
        assert rt.crashes() == {"dead": "its pid 1 (the executor) ended while the server was not running"}
        await rt.restore(served("dead"))
        assert await http_get(rt, "dead", 8008, "/note") == b"mine\n"
        await rt.stop("dead")
        assert rt.crashes() == {}
        assert not directory.exists()


@pytest.mark.parametrize("left", ["no recorded pid", "no writable layer"])
async def test_a_dead_sandbox_that_never_ran_or_cannot_start_again_is_not_kept(
    tmp_path: Path, launchers: list[subprocess.Popen[bytes]], left: str
) -> None:
    await _before_the_crash(tmp_path, False, "dead", launchers, snapshot=False)
    directory = tmp_path / "sandboxes" / "dead"
    pid = int((directory / "pid").read_text())
    os.kill(pid, signal.SIGKILL)
    launchers[0].wait(10)
    if left == "no recorded pid":  # what a create cut short before its pid 1 ran leaves
        (directory / "pid").unlink()
    else:
        shutil.rmtree((directory / "upper").resolve())

    async with local_runtime(tmp_path, criu=False) as rt:
        assert await rt.recover() == set()
        assert (rt.snapshotted_ids(), rt.crashes()) == (set(), {})  # the activator kills its record, as before
        await rt.stop("dead")  # what that kill does
        assert not directory.exists()
