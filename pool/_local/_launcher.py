"""How one sandbox process tree is started: the bubblewrap command line and the launcher steps before it.

The launcher is the forked child that becomes bubblewrap. Still root on the host, it joins the sandbox's
cgroups, makes a private mount namespace, mounts each template layer id-shifted into the sandbox's uid
range with the writable layer over them (overlayfs) and its volumes, id-shifted too, then enters the
sandbox's user namespace as its root and execs bubblewrap, which adds the pid, ipc, uts and network
namespaces, the seccomp filter and the capability set, and runs the executor as the sandbox's pid 1. The
mounts live exactly as long as the sandbox: nothing is left on the host when its processes are gone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from executor.envd import ENVD_PORT
from pool._errors import RuntimeFailure
from pool._local._sandbox import Sandbox
from pool._local._syscalls import (
    CLONE_NEWNS,
    CLONE_NEWUSER,
    MS_BIND,
    attach_idmapped,
    bind_idmapped,
    clone_tree,
    make_mounts_private,
    mount,
    setns,
    unmount_lazily,
    unshare,
)
from pool._local._userns import create_userns

__all__ = [
    "EXECUTOR_LOG",
    "ROOT_MOUNTPOINT",
    "SANDBOX_CAPABILITIES",
    "SANDBOX_PATH",
    "VOLUMES_FILE",
    "bwrap_argv",
    "launch",
    "launcher_steps",
    "root_mounts",
    "shm_size",
]  # fmt: skip

EXECUTOR_LOG = "/var/log/agent-sandbox-executor.log"
# Root inside gets Docker's default set, valid only inside its own user namespace; the seccomp filter
# blocks what those would otherwise allow against the kernel (mount, namespaces, ptrace, …).
SANDBOX_CAPABILITIES = (
    "CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD "
    "AUDIT_WRITE SETFCAP"
).split()
# Where the launcher mounts the sandbox's root in its private mount namespace. bubblewrap opens it as the
# sandbox's root uid, which could not traverse a data directory only host root may enter (e.g. mode 0700).
ROOT_MOUNTPOINT = Path("/run/agent-sandbox/rootfs")
_LAYER_MOUNTS = Path("/run/agent-sandbox/layers")  # the template layers, id-mapped, under the overlay (`root_mounts`)
_WRITABLE_MOUNT = Path("/run/agent-sandbox/writable")  # the directory with the overlay's upper and work
VOLUMES_FILE = "volumes.json"  # in the sandbox directory: the volumes it mounts (`volume_mounts`)
VOLUMES_DIR = "volumes"  # beside the sandboxes' directory in the data directory: the volumes (`_volumes`)
# Every sandbox process starts with this PATH unless its template or request sets another.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def bwrap_argv(
    *, seccomp_fd: int, status_fd: int, ready_fd: int, cgroup_view: list[tuple[str, str]], shm_bytes: int
) -> list[str]:
    """`cgroup_view`: the sandbox's own cgroup directories and where they appear, read-only, on a tmpfs /sys.
    `shm_bytes`: the size of `/dev/shm`, a tmpfs every user may write (POSIX shared memory: Chromium, Python's
    multiprocessing); what it holds is charged to the sandbox's memory cgroup like any of its memory."""
    caps = [arg for cap in SANDBOX_CAPABILITIES for arg in ("--cap-add", f"CAP_{cap}")]
    cgroups = [arg for host, inside in cgroup_view for arg in ("--ro-bind", host, inside)]
    return [
        "bwrap",
        "--bind", str(ROOT_MOUNTPOINT), "/",
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "01777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm",
        "--tmpfs", "/sys", "--dir", "/sys/fs", "--dir", "/sys/fs/cgroup", *cgroups,  # --dir: 0755, for `user` too
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
        "--hostname", "sandbox",
        "--new-session",
        "--as-pid-1",
        "--cap-drop", "ALL", *caps,
        "--seccomp", str(seccomp_fd),
        "--json-status-fd", str(status_fd),
        "--clearenv", "--setenv", "PATH", SANDBOX_PATH, "--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8",
        "--chdir", "/",
        "--",
        "/usr/bin/python3", "-I", "-S", "/opt/agent-sandbox/run-executor.py",
        "--port", str(ENVD_PORT), "--ready-fd", str(ready_fd), "--log", EXECUTOR_LOG,
    ]  # fmt: skip


def shm_size(memory_mb: int) -> int:
    """`/dev/shm`'s size: half the sandbox's memory, at most 1 GiB (Docker gives 64 MiB, too little for Chromium)."""
    return min(memory_mb << 19, 1 << 30)


def launcher_steps(
    *, sandbox_dir: Path, layers: list[Path], userns_fd: int, cgroup_procs: list[str]
) -> Callable[[], None]:
    """The `preexec_fn` that prepares the launcher child before it execs bubblewrap."""
    root = root_mounts(sandbox_dir, layers)

    def steps() -> None:
        for procs in cgroup_procs:
            with open(procs, "w") as f:
                f.write("0")
        unshare(CLONE_NEWNS)
        make_mounts_private()
        root(userns_fd, 0)
        setns(userns_fd, CLONE_NEWUSER)
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)

    return steps


def root_mounts(sandbox_dir: Path, layers: list[Path]) -> Callable[[int, int], None]:
    """What mounts the sandbox's root at ROOT_MOUNTPOINT, to be called (with the user namespace whose id map
    shifts the layers' owners, and mount flags) in a private mount namespace just copied from the host's.

    The id-mapped template layers and the directory of the writable layer are bound at neutral paths under
    /run/agent-sandbox first, and the overlay is made of those: its options are what /proc/self/mountinfo shows
    inside, which then names no host path (data directory, sandbox ids, image cache). The mount points are made
    here, on the host, before the fork. An overlay still going away (a sandbox just dumped by CRIU) makes the
    mount EBUSY for a moment: it is tried again for up to 5 s. Then each volume of `volumes.json` is bound
    id-mapped, read-write, at its path in the root, so the sandbox's ids own what its ids own in the volume.
    """
    lowers = [f"{_LAYER_MOUNTS}/{i}" for i in range(len(layers))]
    volumes = volume_mounts(sandbox_dir)
    root_uid = os.stat(sandbox_dir / "upper").st_uid if volumes else 0  # the sandbox's root, outside
    for lower in (*lowers, str(_WRITABLE_MOUNT)):
        os.makedirs(lower, exist_ok=True)
    writable = str((sandbox_dir / "upper").resolve().parent)  # with `upper` and `work` in it (`_disk`)
    options = f"lowerdir={':'.join(lowers)},upperdir={_WRITABLE_MOUNT}/upper,workdir={_WRITABLE_MOUNT}/work"
    sources = [str(layer) for layer in layers]

    def mount_root(userns_fd: int, flags: int) -> None:
        trees = [(clone_tree(files), path) for files, path in volumes]  # before the volumes' host mounts go
        drop_other_sandboxes_mounts(sandbox_dir)
        for source, target in zip(sources, lowers, strict=True):
            bind_idmapped(source, target, userns_fd, read_only=True)
        mount(writable, str(_WRITABLE_MOUNT), "", "", MS_BIND)
        deadline = time.monotonic() + 5
        while True:
            try:
                mount("overlay", str(ROOT_MOUNTPOINT), "overlay", options, flags)
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        for tree, path in trees:
            point = mount_point(str(ROOT_MOUNTPOINT), path, root_uid)
            try:
                attach_idmapped(tree, point, userns_fd, read_only=False)
            finally:
                os.close(point)
                os.close(tree)

    return mount_root


def volume_mounts(sandbox_dir: Path) -> list[tuple[str, str]]:
    """The volumes the sandbox mounts: (their files on the host, the path inside), from `volumes.json`."""
    try:
        return [(files, path) for files, path in json.loads((sandbox_dir / VOLUMES_FILE).read_text())]
    except FileNotFoundError:
        return []


def mount_point(root: str, path: str, owner: int) -> int:
    """A descriptor of directory `path` under `root` (the sandbox's root), made (owned by `owner`, the sandbox's
    root) where it is missing. No component is followed if it is a symlink: a template's or a snapshot's link
    must not move a mount out of the sandbox's root (the start fails instead)."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in (p for p in path.split("/") if p):
            try:
                child = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=fd)
                os.chown(part, owner, owner, dir_fd=fd, follow_symlinks=False)
                child = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def drop_other_sandboxes_mounts(sandbox_dir: Path) -> None:
    """In a private mount namespace just copied from the host's, detach the other sandboxes' filesystems
    (`_disk`) and every volume's (`_volumes`; this sandbox's own are bound from clones taken before): the
    copies would hold each of them, and its loop device and disk space, for as long as this namespace lives,
    long after the other sandbox was killed or the volume destroyed and its mount on the host was gone."""
    siblings, own = f"{sandbox_dir.parent}/", f"{sandbox_dir}/"
    volumes = f"{sandbox_dir.parent.parent / VOLUMES_DIR}/"
    with open("/proc/self/mountinfo") as f:  # a space in a path is written \\040 there, and so on
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in f]
    for point in reversed(points):  # the deepest first
        if (point.startswith(siblings) and not point.startswith(own)) or point.startswith(volumes):
            unmount_lazily(point)


async def launch(
    box: Sandbox, layers: list[Path], *, seccomp: bytes, within: float, pool: concurrent.futures.Executor
) -> None:
    """Start the sandbox's process tree over `layers`; sets `box.process` and `box.pid` once the executor is up.

    `within` bounds the wait for bubblewrap's status and the executor's readiness; the fork runs on `pool`.
    """
    status_r, status_w = os.pipe()
    ready_r, ready_w = os.pipe()
    try:
        spawn = functools.partial(_spawn, box, layers, seccomp, status_w, ready_w)
        box.process = await asyncio.get_running_loop().run_in_executor(pool, spawn)
    finally:
        os.close(status_w)
        os.close(ready_w)
    try:
        async with asyncio.timeout(within):
            box.pid = json.loads(await _read_line(status_r))["child-pid"]
            if await _read_line(ready_r) != b"ready\n":
                raise RuntimeFailure(f"sandbox did not start: {_launcher_log(box)}")
    except (TimeoutError, ValueError, KeyError) as exc:
        raise RuntimeFailure(f"sandbox did not start: {exc!r} {_launcher_log(box)}") from exc
    finally:
        os.close(status_r)
        os.close(ready_r)


def _spawn(box: Sandbox, layers: list[Path], seccomp: bytes, status_w: int, ready_w: int) -> subprocess.Popen[bytes]:
    """Fork the launcher (blocking: runs in a worker thread)."""
    seccomp_r, seccomp_w = os.pipe()
    os.write(seccomp_w, seccomp)
    os.close(seccomp_w)
    userns_fd = create_userns(box.slot)
    argv = bwrap_argv(
        seccomp_fd=seccomp_r, status_fd=status_w, ready_fd=ready_w, cgroup_view=box.cgroup.sandbox_view(),
        shm_bytes=shm_size(box.resources.memory_mb),
    )  # fmt: skip
    steps = launcher_steps(
        sandbox_dir=box.directory, layers=layers, userns_fd=userns_fd, cgroup_procs=box.cgroup.procs_files()
    )
    try:
        with open(box.directory / "launcher.log", "wb") as log:
            return subprocess.Popen(
                argv, preexec_fn=steps, pass_fds=(seccomp_r, status_w, ready_w),  # the preexec uses userns_fd
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )  # fmt: skip
    finally:
        os.close(seccomp_r)
        os.close(userns_fd)


def _launcher_log(box: Sandbox) -> str:
    try:
        return (box.directory / "launcher.log").read_text(errors="replace")[-2000:]
    except OSError:
        return ""


async def _read_line(fd: int) -> bytes:
    """Read one line from a pipe without blocking the event loop."""
    loop = asyncio.get_running_loop()
    data = b""
    while not data.endswith(b"\n"):
        readable = asyncio.Event()
        loop.add_reader(fd, readable.set)
        try:
            await readable.wait()
        finally:
            loop.remove_reader(fd)
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data
