"""Each local sandbox's writable layer on a filesystem of its own, so its template's `disk_mb` is a limit.

The overlay's upper and work directories live on an ext4 image file of exactly `disk_mb` MiB
(`<sandbox_dir>/disk.img`, sparse: it holds what the sandbox wrote, not its size), loop-mounted at
`<sandbox_dir>/disk`; `upper` and `work` in the sandbox directory are symlinks into it, so everything that
reads the writable layer (snapshots, template builds, CRIU's restore) is unchanged. What this gives:

* a write past the limit, or past its inode limit (one inode per `BYTES_PER_INODE`), fails inside with
  ENOSPC; the sandbox stays usable once files are removed;
* `df` inside shows the sandbox's own size and use (overlayfs reports its upper filesystem's);
* use and size come from one `statvfs`, never a walk of the sandbox's files;
* `kill` unmounts and deletes one file, however many files the sandbox made;
* deleted files give their space back to the host (`discard` punches holes in the image).

Why this and not project quotas: the data directory's filesystem is whatever the host has (here ext4
mounted without `prjquota`, which cannot be changed under a running host), and a quota would not give `df`
inside nor a cheap kill. Measured on this machine (2 cores, ext4 on virtio): `mkfs.ext4` of a 4 GiB image
19 ms, loop set-up and mount ~1 ms, unmount ~1 ms; `loadtests/bench_disk.py` prints what it adds to a start.

The mount is in the host's mount namespace (nodev, nosuid: host root never runs what a tenant wrote), so it
outlives a restart of the server like the sandbox's processes do; `attach` mounts it again after a reboot.
`noinit_itable`: the kernel would otherwise zero every inode table in the background, writing ~1/32 of the
image per sandbox for nothing (fresh block groups are flagged uninitialised and read as empty).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import subprocess
import time
from pathlib import Path

from pool._errors import RuntimeFailure
from pool._local._syscalls import MS_NODEV, MS_NOSUID, mount, unmount_lazily

__all__ = ["BYTES_PER_INODE", "DiskImages", "DiskUsage", "disk_usage"]

BYTES_PER_INODE = 8192  # 524,288 files in a 4 GiB sandbox (ext4's own default ratio is 16 KiB)
_IMAGE, _MOUNT = "disk.img", "disk"
_LAYER_DIRS = ("upper", "work")

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4  # the loop device goes with the last unmount
# The image's pages are not cached a second time outside the sandbox's memory cgroup (a backing filesystem
# without O_DIRECT, such as tmpfs, makes the kernel fall back to buffered I/O by itself).
_LO_FLAGS_DIRECT_IO = 16


class _LoopInfo64(ctypes.Structure):
    _fields_ = [
        ("lo_device", ctypes.c_uint64),
        ("lo_inode", ctypes.c_uint64),
        ("lo_rdevice", ctypes.c_uint64),
        ("lo_offset", ctypes.c_uint64),
        ("lo_sizelimit", ctypes.c_uint64),
        ("lo_number", ctypes.c_uint32),
        ("lo_encrypt_type", ctypes.c_uint32),
        ("lo_encrypt_key_size", ctypes.c_uint32),
        ("lo_flags", ctypes.c_uint32),
        ("lo_file_name", ctypes.c_uint8 * 64),
        ("lo_crypt_name", ctypes.c_uint8 * 64),
        ("lo_encrypt_key", ctypes.c_uint8 * 32),
        ("lo_init", ctypes.c_uint64 * 2),
    ]


class _LoopConfig(ctypes.Structure):
    _fields_ = [
        ("fd", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("info", _LoopInfo64),
        ("reserved", ctypes.c_uint64 * 8),
    ]


class DiskUsage:
    """Bytes and inodes a sandbox's filesystem has and uses, as `df` inside shows them."""

    __slots__ = ("bytes_total", "bytes_used", "inodes_total", "inodes_used")

    def __init__(self, stat: os.statvfs_result) -> None:
        self.bytes_total = stat.f_blocks * stat.f_frsize
        self.bytes_used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
        self.inodes_total = stat.f_files
        self.inodes_used = stat.f_files - stat.f_ffree


class DiskImages:
    """Makes, mounts and removes the sandboxes' filesystems; `enabled=False` keeps plain directories (no limit)."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled

    def create(self, directory: Path, disk_mb: int, owner: int) -> None:
        """Give a new sandbox in `directory` its writable layer, owned by host id `owner` (blocking)."""
        if not self.enabled:
            for name in _LAYER_DIRS:
                (directory / name).mkdir(exist_ok=True)
                os.chown(directory / name, owner, owner)
            return
        self.format(directory, disk_mb, owner)
        for name in _LAYER_DIRS:
            (directory / _MOUNT / name).mkdir()
            os.chown(directory / _MOUNT / name, owner, owner)
            (directory / name).symlink_to(Path(_MOUNT) / name)

    def format(self, directory: Path, disk_mb: int, owner: int) -> Path:
        """Make a filesystem of `disk_mb` MiB in `directory` (its root owned by `owner`, nothing else in it) and
        mount it; where it is mounted (blocking). Plain directory `disk` when images are not enabled."""
        if not self.enabled:
            (directory / _MOUNT).mkdir(exist_ok=True)
            os.chown(directory / _MOUNT, owner, owner)
            return directory / _MOUNT
        image = directory / _IMAGE
        with open(image, "wb") as f:
            f.truncate(disk_mb << 20)
        inodes = max((disk_mb << 20) // BYTES_PER_INODE, 4096)
        # 4 KiB blocks whatever the size (mkfs picks 1 KiB below 512 MiB, which the loop's block size refuses); no
        # reserve for root; nothing zeroed or discarded up front: the image stays sparse.
        extended = f"lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner={owner}:{owner}"
        result = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0", "-N", str(inodes), "-E", extended, str(image)],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeFailure(f"mkfs.ext4 for {directory.name} failed: {result.stderr.strip()[-500:]}")
        self.attach(directory)
        with contextlib.suppress(FileNotFoundError):
            (directory / _MOUNT / "lost+found").rmdir()  # nobody's: a sandbox sees its upper directory, or a volume
        return directory / _MOUNT

    def attach(self, directory: Path) -> None:
        """Mount the sandbox's filesystem if it has one and it is not mounted (after a reboot) (blocking);
        RuntimeFailure when it cannot be (no loop devices here any more, a damaged image)."""
        image, target = directory / _IMAGE, directory / _MOUNT
        if not image.exists() or os.path.ismount(target):
            return
        try:
            self._mount(image, target)
        except OSError as exc:
            raise RuntimeFailure(f"the filesystem of {directory.name} cannot be mounted: {exc}") from exc

    @staticmethod
    def _mount(image: Path, target: Path) -> None:
        target.mkdir(exist_ok=True)
        fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        try:
            device, loop = _attach_loop(fd)
        finally:
            os.close(fd)
        try:  # the device stays configured while `loop` is open, and from then on while it is mounted
            mount(device, str(target), "ext4", "noinit_itable,discard,errors=remount-ro", MS_NOSUID | MS_NODEV)
        finally:
            os.close(loop)

    def detach(self, directory: Path) -> None:
        """Unmount the sandbox's filesystem (its loop device goes with it); nothing to do when it has none."""
        target = directory / _MOUNT
        if os.path.ismount(target):
            unmount_lazily(str(target))


def disk_usage(directory: Path) -> DiskUsage | None:
    """What the sandbox's filesystem holds (one statvfs), or None when it has none of its own (or it is not
    mounted)."""
    target = directory / _MOUNT
    if not os.path.ismount(target):
        return None
    return DiskUsage(os.statvfs(target))


def _attach_loop(fd: int) -> tuple[str, int]:
    """A free loop device backed by `fd`, and an open fd of it. Until that closes or the device is mounted it
    stays; after that it goes at its last unmount. Another process may take the device the kernel named free
    before this one configures it (EBUSY): then ask again."""
    config = _LoopConfig(fd=fd, block_size=4096)
    config.info.lo_flags = _LO_FLAGS_AUTOCLEAR | _LO_FLAGS_DIRECT_IO
    deadline = time.monotonic() + 5
    control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        while True:
            device = f"/dev/loop{fcntl.ioctl(control, _LOOP_CTL_GET_FREE)}"
            loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(loop, _LOOP_CONFIGURE, config)
                return device, loop
            except OSError as exc:
                os.close(loop)
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise OSError(exc.errno, f"configure {device}: {exc.strerror}") from None
    finally:
        os.close(control)
