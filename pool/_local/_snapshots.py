"""Snapshots of local sandboxes: whether CRIU works here, and the disk side of taking and finishing them.

A snapshot is "criu" (memory image in `checkpoint/` plus the writable layer) where the start-up trial of
CRIU passed and the dump worked, else "filesystem" (the writable layer alone: the overlay's upper directory
already is the filesystem snapshot, nothing is copied). `snapshot.json` in the sandbox directory says which
(`_sandbox`); it is written before a snapshot begins and removed only once a restore is complete, so after a
crash its presence alone says "snapshotted", and `settle` makes whatever a crash interrupted agree with it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import threading
import time
from pathlib import Path

from pool._errors import RuntimeFailure
from pool._local._criu import CriuBinary, CriuStatus, find_criu, log_tail, probe
from pool._local._disk import disk_usage
from pool._local._sandbox import Sandbox, tree_size
from pool._runtime import SnapshotInfo, SnapshotKind

__all__ = ["CriuSupport", "drop_image", "has_image", "settle", "snapshot_bytes"]

_DUMP_FAILED = "Dumping FAILED"


class CriuSupport:
    """The result of one CRIU trial, run in a thread when the runtime starts (it takes ~0.3 s)."""

    def __init__(self, directory: Path | None) -> None:
        self._found: concurrent.futures.Future[tuple[CriuStatus, CriuBinary | None]] = concurrent.futures.Future()
        if directory is None:
            self._found.set_result((CriuStatus(available=False, reason="CRIU is turned off in the settings"), None))
        else:
            threading.Thread(target=self._probe, args=(directory,), name="criu-probe", daemon=True).start()

    def _probe(self, directory: Path) -> None:
        status = probe(directory)
        binary = None
        if status.available:
            try:
                binary = find_criu(directory)
            except RuntimeFailure as exc:
                status = CriuStatus(available=False, version=status.version, reason=str(exc))
        self._found.set_result((status, binary))

    def status_now(self) -> CriuStatus | None:
        """The trial's result, or None while it still runs (never blocks)."""
        return self._found.result()[0] if self._found.done() else None

    async def status(self) -> CriuStatus:
        return (await asyncio.wrap_future(self._found))[0]

    async def binary(self) -> CriuBinary | None:
        """The CRIU to checkpoint with, or None when the trial failed."""
        return (await asyncio.wrap_future(self._found))[1]


def has_image(directory: Path) -> bool:
    return (directory / "checkpoint" / "inventory.img").is_file()


def drop_image(directory: Path) -> None:
    """Remove a memory image (stale as soon as the sandbox runs again) and the leftovers of a dump."""
    for name in ("checkpoint", "checkpoint.new", "checkpoint.old"):
        shutil.rmtree(directory / name, ignore_errors=True)


def snapshot_bytes(directory: Path) -> int:
    """Disk held by a snapshot: the memory image, if any, and the writable layer (blocking; its own filesystem's
    use where it has one, not a walk of its files)."""
    disk = disk_usage(directory)
    upper = tree_size(directory / "upper") if disk is None else disk.bytes_used
    return tree_size(directory / "checkpoint") + upper


def settle(box: Sandbox, recorded: SnapshotInfo) -> SnapshotInfo:
    """Finish a snapshot that a crash interrupted, or undo a restore that it did (blocking; processes aside).

    A CRIU still dumping or restoring this sandbox is killed; a dump that completed is kept, one that did not
    leaves the files only. Returns what the sandbox holds now, recorded again if that changed. The caller
    then kills whatever still runs in the sandbox's cgroups.
    """
    _kill_stray_criu(box.directory)
    new, image = box.directory / "checkpoint.new", box.directory / "checkpoint"
    if not has_image(box.directory) and _dump_complete(new):
        shutil.rmtree(image, ignore_errors=True)
        new.rename(image)
    kind: SnapshotKind = "criu" if recorded.kind == "criu" and has_image(box.directory) else "filesystem"
    if kind == "filesystem":
        drop_image(box.directory)
    info = SnapshotInfo(kind=kind, seconds=recorded.seconds, image_bytes=snapshot_bytes(box.directory))
    if info != recorded:
        box.set_snapshot_info(info)
    return info


def _dump_complete(images: Path) -> bool:
    """CRIU writes the inventory after every other image, and logs (at its default level) only failures."""
    return (images / "inventory.img").is_file() and _DUMP_FAILED not in log_tail(images / "dump.log")


def _kill_stray_criu(directory: Path, timeout: float = 5.0) -> None:
    """SIGKILL a `criu` left working on this sandbox by a server that died, and wait until it is gone."""
    images = str(directory / "checkpoint")
    strays = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.decode(errors="replace").startswith(images) for arg in argv) and b"-D" in argv:
            strays.append(int(entry))
    for pid in strays:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in strays) and time.monotonic() < deadline:
        time.sleep(0.01)
