"""A local sandbox's `disk_mb` is a limit: its writable layer is a filesystem of that size (`pool._local._disk`).

A write or a file past it fails inside with ENOSPC and the host loses at most that much; `df` inside shows the
sandbox's own size; the metrics read one statvfs, never a walk of the sandbox's files; a kill frees its loop
device even while other sandboxes run; and the filesystem comes back after a reboot unmounted it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pool import LocalRuntime, RuntimeFailure, Template
from pool._local import _core, _snapshots
from pool._local._disk import BYTES_PER_INODE, DiskImages
from tests.runtime_fixtures import TEMPLATES, base_with, local_runtime, new_runtime, runtime_settings, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

SMALL_MB = 64


def _small(disk_mb: int = SMALL_MB) -> Template:
    return base_with(disk_mb=disk_mb)


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    async with local_runtime(tmp_path, criu=False) as runtime:
        yield runtime


def _image(tmp_path: Path, sandbox_id: str) -> Path:
    return tmp_path / "sandboxes" / sandbox_id / "disk.img"


def _loop_devices_of(image: Path) -> list[str]:
    """Loop devices whose backing file is `image` (deleted or not)."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        if backing.read_text().strip().removesuffix(" (deleted)") == str(image):
            found.append(backing.parent.parent.name)
    return found


async def test_a_write_past_disk_mb_fails_with_enospc_and_the_sandbox_recovers_when_files_go(
    rt: LocalRuntime, tmp_path: Path
) -> None:
    await rt.start(spec("full", _small()))
    image = _image(tmp_path, "full")
    before = image.stat().st_blocks * 512
    filled = await run_in_sandbox(rt, "full", f"dd if=/dev/zero of=$HOME/fill bs=1M count={2 * SMALL_MB}")
    assert filled.exit_code != 0
    assert "No space left on device" in filled.stderr
    grown = image.stat().st_blocks * 512 - before
    assert 0 < grown <= SMALL_MB << 20  # the host lost at most the sandbox's size
    df = await run_in_sandbox(rt, "full", "df -B1 --output=size,used,avail / | tail -1")
    size, used, avail = map(int, df.stdout.split())
    assert (SMALL_MB - 16) << 20 <= size <= SMALL_MB << 20  # its own size (less ext4's own metadata)
    assert avail < 1 << 20
    assert used > (SMALL_MB - 24) << 20
    again = await run_in_sandbox(rt, "full", "rm $HOME/fill && echo ok > $HOME/after && cat $HOME/after")
    assert again.stdout == "ok\n", again
    shrunk = await run_in_sandbox(rt, "full", "df -B1 --output=used / | tail -1")
    assert int(shrunk.stdout) < 4 << 20


async def test_files_past_the_inode_limit_fail_with_enospc(rt: LocalRuntime) -> None:
    await rt.start(spec("inodes", _small()))
    inodes = (SMALL_MB << 20) // BYTES_PER_INODE
    made = await run_in_sandbox(rt, "inodes", f"mkdir $HOME/many && cd $HOME/many && touch $(seq {inodes + 8192})")
    assert made.exit_code != 0
    assert "No space left on device" in made.stderr
    shown = await run_in_sandbox(rt, "inodes", "df --output=itotal,iavail / | tail -1")
    total, available = map(int, shown.stdout.split())
    assert inodes <= total < inodes + 8192  # mkfs rounds up to whole block groups
    assert available == 0


async def test_metrics_read_the_sandboxs_filesystem_without_walking_its_files(
    rt: LocalRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    await rt.start(spec("metered", _small(256)))

    def no_walk(root: Path) -> int:
        raise AssertionError(f"walked {root}")

    monkeypatch.setattr(_core, "tree_size", no_walk)
    monkeypatch.setattr(_snapshots, "tree_size", lambda root: 0 if not root.exists() else no_walk(root))
    empty = await rt.stats("metered")
    await run_in_sandbox(rt, "metered", "head -c 20M /dev/urandom > $HOME/data && sync")
    written = await rt.stats("metered")
    assert written.disk_used - empty.disk_used >= 19 << 20
    df = await run_in_sandbox(rt, "metered", "df -B1 --output=size / | tail -1")
    assert written.disk_total == int(df.stdout)


async def test_a_killed_sandboxs_loop_device_goes_while_other_sandboxes_run(rt: LocalRuntime, tmp_path: Path) -> None:
    await rt.start(spec("first", _small()))
    image = _image(tmp_path, "first")
    assert len(_loop_devices_of(image)) == 1
    await rt.start(spec("second", _small()))  # its mount namespace was copied while the first's disk was mounted
    await rt.stop("first")
    assert _loop_devices_of(image) == []
    assert not image.exists()
    assert (await run_in_sandbox(rt, "second", "echo alive")).stdout == "alive\n"


async def test_a_snapshotted_sandboxs_filesystem_is_mounted_again_after_a_reboot(
    rt: LocalRuntime, tmp_path: Path
) -> None:
    await rt.start(spec("rebooted", _small()))
    await run_in_sandbox(rt, "rebooted", "echo kept > $HOME/marker")
    await rt.snapshot("rebooted")
    directory = tmp_path / "sandboxes" / "rebooted"
    DiskImages(enabled=True).detach(directory)  # what a reboot does to it
    assert not os.path.ismount(directory / "disk")
    await rt.restore(spec("rebooted", _small()))
    assert (await run_in_sandbox(rt, "rebooted", "cat $HOME/marker")).stdout == "kept\n"


async def test_a_tenants_stalled_walks_do_not_hold_another_sandboxs_start_or_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no filesystem of its own (the limit off) a sandbox's size is a walk: however many of them hang, they
    wait in their own pool (`_workers`), and a start and a stop still go through."""
    release = threading.Event()

    def stalled_walk(root: Path) -> int:
        release.wait(120)
        return 0

    monkeypatch.setattr(_core, "tree_size", stalled_walk)
    settings = msgspec.structs.replace(runtime_settings(tmp_path, criu=False), disk_limit=False)
    runtime = new_runtime(settings)
    await asyncio.to_thread(runtime.images.build, TEMPLATES["base"], lambda _line: None)  # no-op when built
    try:
        await runtime.start(spec("walked"))
        polls = [asyncio.create_task(runtime.stats("walked")) for _ in range(24)]
        await asyncio.sleep(0.2)
        async with asyncio.timeout(60):
            await runtime.start(spec("other"))
            assert (await run_in_sandbox(runtime, "other", "echo ok")).stdout == "ok\n"
            await runtime.stop("other")
        assert not any(poll.done() for poll in polls)
        release.set()
        await asyncio.gather(*polls)
    finally:
        release.set()
        for sandbox_id in runtime.sandbox_ids():
            await runtime.stop(sandbox_id)
        await runtime.criu_trial()
        runtime.close()


async def test_a_snapshot_whose_filesystem_cannot_be_mounted_fails_alone_and_the_restart_goes_on(
    rt: LocalRuntime, tmp_path: Path
) -> None:
    await rt.start(spec("damaged", _small()))
    await rt.snapshot("damaged")
    directory = tmp_path / "sandboxes" / "damaged"
    DiskImages(enabled=True).detach(directory)
    with open(directory / "disk.img", "r+b") as image:  # its superblock gone: not ext4 any more
        image.write(b"\0" * 65536)
    restarted = new_runtime(runtime_settings(tmp_path, criu=False))
    try:
        assert await restarted.recover() == set()  # it does not raise: the server starts
        assert restarted.snapshotted_ids() == {"damaged"}
        with pytest.raises(RuntimeFailure, match="cannot be mounted"):
            await restarted.restore(spec("damaged", _small()))
    finally:
        for sandbox_id in [*restarted.sandbox_ids(), *restarted.snapshotted_ids()]:
            await restarted.stop(sandbox_id)
        await restarted.criu_trial()
        restarted.close()


async def test_a_start_cancelled_while_its_filesystem_is_made_leaves_nothing(
    rt: LocalRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = threading.Event()
    create = DiskImages.create

    def slow_create(self: DiskImages, directory: Path, disk_mb: int, owner: int) -> None:
        create(self, directory, disk_mb, owner)
        made.set()
        time.sleep(0.5)

    monkeypatch.setattr(DiskImages, "create", slow_create)
    starting = asyncio.create_task(rt.start(spec("cancelled", _small())))
    await asyncio.to_thread(made.wait, 30)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    directory = tmp_path / "sandboxes" / "cancelled"
    assert not directory.exists()
    assert _loop_devices_of(directory / "disk.img") == []
