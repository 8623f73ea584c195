"""Checkpoint a running sandbox to disk with CRIU (its processes end, its RAM is freed) and restore it.

What a snapshot is: the memory and process image in `<sandbox_dir>/checkpoint/`, plus the overlay's upper
directory, which stays where it is (CRIU does not copy file contents: files are reopened by path).

Why the command lines look the way they do (`criu-debian.md`, `local-runtime-lab.md` §6):
* `--external mnt[]` (dump and restore): bubblewrap's /dev/null, /dev/zero, … are binds of the host's
  devtmpfs nodes; CRIU finds them at the same paths on the host ("auto" external mounts). /proc, the /dev
  tmpfs (its contents go into the image) and the devpts instance are recreated by CRIU itself.
* The root mount is the overlay, mounted at ROOT_MOUNTPOINT in the launcher's private mount namespace and
  gone with it. `restore` runs criu in a fresh private mount namespace where the same id-mapped lower
  layers and the same upper directory are mounted the same way again, and passes that as `--root`.
* `--freeze-cgroup`: CRIU freezes (or finds frozen) the whole sandbox at once instead of seizing tasks one
  by one; an already paused sandbox is dumped as it is.
* `--tcp-established`: connections between processes inside survive; connections from the gateway do
  not (their host ends are not in the image), so close them first. `--skip-in-flight`: a connection
  still waiting in a listener's accept queue is dropped instead of failing the dump; a port-readiness probe
  (connect, close) right before a snapshot leaves exactly that. `--network-lock nftables` uses the
  libnftables CRIU is linked with; there is no iptables on these hosts.
* `--irmap-scan-path`: see _IRMAP.
* `--file-locks` (dump and restore): flock/POSIX locks held inside are dumped and taken again (Chromium's
  profile lock, dbus); without it a dump of any sandbox holding one fails.
* CRIU itself carries a patch (scripts/criu-patches/): a bound unix socket restored in a task that shares
  its filesystem context with one of CRIU's helpers (a desktop's dbus-daemon) failed on a needless setns.
* `--cgroup-root C:/path` for each of the sandbox's controllers: the restored tree goes into the cgroups
  the caller created (with the limits it wants), whatever the parent cgroup is called now.
* The user namespace (0 → host base, 65536 ids), seccomp filter, capabilities, no_new_privs and the
  sandbox's pid/net/ipc/uts/cgroup namespaces are in the image and recreated by CRIU.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from pool._errors import RuntimeFailure
from pool._local._criu import CriuBinary, log_tail, run_criu
from pool._local._launcher import ROOT_MOUNTPOINT, root_mounts
from pool._local._syscalls import CLONE_NEWNS, MS_NODEV, MS_NOSUID, make_mounts_private, unshare
from pool._local._userns import create_userns, host_id_base

__all__ = ["RESTORE_TIMEOUT", "CheckpointInfo", "checkpoint", "restore"]

RESTORE_TIMEOUT = 60.0  # seconds for `criu restore`; a desktop's takes ~0.4 s

# Directories where CRIU looks for what an inotify watch (the executor's WatchDir; a desktop's session, panel
# and dbus on fonts, menus and applications) points at: overlayfs file handles cannot be reopened, so watched
# files must be found by path, and only under these. CRIU scans them only for a watch it cannot resolve.
_WATCHED = ("/home", "/root", "/tmp", "/opt", "/srv", "/workspace", "/etc", "/usr/share", "/usr/local/share")
_IRMAP = [arg for d in _WATCHED for arg in ("--irmap-scan-path", d)]


class CheckpointInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A finished checkpoint: where its image is, how big it is, and how long the dump took."""

    directory: Path
    image_bytes: int
    seconds: float


def checkpoint(
    criu: CriuBinary, *, sandbox_dir: Path, pid: int, freezer: Path, leave_running: bool = False
) -> CheckpointInfo:
    """Dump the sandbox whose pid 1 has host pid `pid` into `<sandbox_dir>/checkpoint/` (blocking).

    Unless `leave_running`, every process of the sandbox is gone on return (the freezer cgroup is empty;
    the caller still reaps the bubblewrap launcher it started). A paused sandbox stays paused when left
    running. On failure the sandbox is left as it was and the previous checkpoint, if any, is kept.
    """
    target, new = sandbox_dir / "checkpoint", sandbox_dir / "checkpoint.new"
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(mode=0o700)
    argv = [
        str(criu.path), "dump", "-t", str(pid), "-D", str(new), "-o", "dump.log",
        "--freeze-cgroup", str(freezer), "--network-lock", "nftables", "--tcp-established", "--skip-in-flight",
        "--external", "mnt[]", "--file-locks", *_IRMAP, *(["--leave-running"] if leave_running else []),
    ]  # fmt: skip
    started = time.monotonic()
    was_frozen = _set_frozen(freezer, True)  # ~1 ms here; criu's own freezing polls every 100 ms
    try:
        run_criu(argv, new / "dump.log", f"checkpoint of {sandbox_dir.name}")
        if not (new / "inventory.img").is_file() or "Dumping FAILED" in log_tail(new / "dump.log"):
            raise RuntimeFailure(f"checkpoint of {sandbox_dir.name} failed: {log_tail(new / 'dump.log')}")
    except RuntimeFailure:
        if not was_frozen:
            _set_frozen(freezer, False)
        with contextlib.suppress(OSError):
            shutil.copy(new / "dump.log", sandbox_dir / "checkpoint-failed.log")
        shutil.rmtree(new, ignore_errors=True)
        raise
    seconds = time.monotonic() - started
    old = sandbox_dir / "checkpoint.old"
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    if leave_running and not was_frozen:
        _set_frozen(freezer, False)
    if not leave_running:
        _empty(freezer)  # what is left is bubblewrap's outer process, outside the image
    size = sum(f.stat().st_size for f in target.iterdir() if f.suffix == ".img")
    return CheckpointInfo(directory=target, image_bytes=size, seconds=seconds)


def restore(
    criu: CriuBinary, *, sandbox_dir: Path, layers: list[Path], userns_slot: int, cgroup_procs: list[str],
    freezer: Path,
) -> int:  # fmt: skip
    """Restore the sandbox from `<sandbox_dir>/checkpoint/` and return its pid 1's new host pid (blocking).

    `layers` are the template's layer directories top-first (as the launcher mounts them), `userns_slot`
    the sandbox's uid range, and `cgroup_procs` the `cgroup.procs` files of its cgroups, which the caller
    has created (empty) beforehand. The restored pid 1 becomes a child of the nearest child subreaper
    (the calling process, when it is one): the caller reaps it. The image stays: the caller removes it
    once it has recorded the sandbox as running again (it is stale from then on). On failure whatever was
    restored is killed.
    """
    images = sandbox_dir / "checkpoint"
    if not (images / "inventory.img").is_file():
        raise RuntimeFailure(f"sandbox {sandbox_dir.name} has no checkpoint to restore")
    pidfile = images / "restored.pid"
    pidfile.unlink(missing_ok=True)
    # Restored tasks open images both as host root and, later, as the sandbox's root (host uid/gid `base`).
    os.chown(images, 0, host_id_base(userns_slot))
    images.chmod(0o750)
    argv = [
        str(criu.path), "restore", "-D", str(images), "-o", "restore.log", "--restore-detached",
        "--pidfile", str(pidfile), "--root", str(ROOT_MOUNTPOINT), "--tcp-established", "--file-locks",
        "--external", "mnt[]", *_cgroup_roots(cgroup_procs),
    ]  # fmt: skip
    userns_fd = create_userns(userns_slot)  # only its id map matters: it shifts the lower layers' owners
    stuck: list[_TaskState] = []
    try:
        with open(images / "restore.out", "wb") as out:
            process = subprocess.Popen(
                argv, preexec_fn=_mount_steps(sandbox_dir, layers, userns_fd), stdin=subprocess.DEVNULL,
                stdout=out, stderr=out,
            )  # fmt: skip
        try:
            returncode = process.wait(RESTORE_TIMEOUT)
        except subprocess.TimeoutExpired:
            stuck = _task_states([process.pid, *_cgroup_pids(freezer)])
            process.kill()
            process.wait()
            raise
        failed = "" if returncode == 0 else f"exit {returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        failed = str(exc)
    finally:
        os.close(userns_fd)
    if failed:
        _empty(freezer)
        with contextlib.suppress(OSError):
            shutil.copy(images / "restore.log", sandbox_dir / "restore-failed.log")
            if stuck:
                with open(sandbox_dir / "restore-failed.log", "a") as log:
                    log.write("\n--- tasks when the restore timed out ---\n")
                    log.writelines(f"{task.summary}\n{task.stack}\n" for task in stuck)
        if stuck:
            failed += "; its tasks then: " + ", ".join(task.summary for task in stuck)
        detail = (images / "restore.out").read_text(errors="replace")[-500:] + "\n" + log_tail(images / "restore.log")
        raise RuntimeFailure(f"restore of {sandbox_dir.name} failed ({failed}): {detail}")
    try:  # a status stolen by another reaper reads as success: the pid file is the real proof
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        _empty(freezer)
        raise RuntimeFailure(f"restore of {sandbox_dir.name} failed: {log_tail(images / 'restore.log')}") from None
    shutil.copy(images / "restore.log", sandbox_dir / "restore.log")
    return pid


class _TaskState(msgspec.Struct, frozen=True):
    """What a process was doing: `criu[812] S do_wait` and its kernel stack."""

    summary: str
    stack: str


def _task_states(pids: list[int]) -> list[_TaskState]:
    """The state, wait channel and kernel stack of each of `pids` and of their children (read as host root)."""
    seen: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.append(pid)
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
    states = []
    for pid in seen:
        proc = Path(f"/proc/{pid}")
        try:
            comm = (proc / "comm").read_text().strip()
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
            wchan = (proc / "wchan").read_text().strip() or "-"
        except OSError:
            continue  # ended meanwhile
        try:
            stack = (proc / "stack").read_text()
        except OSError as exc:
            stack = f"(kernel stack not readable: {exc.strerror})\n"
        states.append(_TaskState(f"{comm}[{pid}] {state} {wchan}", stack))
    return states


def _cgroup_pids(cgroup: Path) -> list[int]:
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _mount_steps(sandbox_dir: Path, layers: list[Path], userns_fd: int) -> Callable[[], None]:
    """The `preexec_fn` of `criu restore`: the launcher's mounts again, in a private mount namespace.

    The overlay gets nosuid,nodev here because CRIU bind-mounts `--root` as the sandbox's `/` with the
    source's flags, and bubblewrap's `--bind` had added those two.
    """
    mount_root = root_mounts(sandbox_dir, layers)

    def steps() -> None:
        try:
            unshare(CLONE_NEWNS)
            make_mounts_private()
            mount_root(userns_fd, MS_NOSUID | MS_NODEV)
        except OSError as exc:
            os.write(2, f"preparing the restore's mounts failed: {exc}\n".encode())  # fd 2 is restore.out
            raise

    return steps


def _cgroup_roots(cgroup_procs: list[str]) -> list[str]:
    """`--cgroup-root controllers:/path` for each cgroup the sandbox goes into (v1), or one root (v2)."""
    mounts: list[tuple[str, str, str]] = []  # (mount point, fstype, super options)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                mounts.append((left.split()[4], fstype, options))
    args: list[str] = []
    for procs in cgroup_procs:
        directory = os.path.dirname(procs)
        point, fstype, options = max(
            (m for m in mounts if directory.startswith(m[0] + "/")), key=lambda m: len(m[0]), default=("", "", "")
        )
        if not point:
            raise RuntimeFailure(f"{procs} is not in a cgroup hierarchy")
        path = directory[len(point) :]
        if fstype == "cgroup2":
            args += ["--cgroup-root", path]
            continue
        controllers = [o for o in options.split(",") if o not in ("rw", "ro") and not o.startswith("name=")]
        args += ["--cgroup-root", f"{','.join(controllers)}:{path}"]
    return args


def _set_frozen(freezer: Path, frozen: bool, timeout: float = 5.0) -> bool:
    """Freeze or thaw the sandbox's cgroup (v1 freezer or v2) and wait for it; return whether it was frozen."""
    v1 = (freezer / "freezer.state").exists()
    control = freezer / ("freezer.state" if v1 else "cgroup.freeze")
    value = ("FROZEN" if frozen else "THAWED") if v1 else str(int(frozen))
    before = control.read_text().strip() in ("FROZEN", "1")
    control.write_text(value)
    deadline = time.monotonic() + timeout
    while (control.read_text().strip() if v1 else _v2_frozen(freezer)) != value:
        if time.monotonic() > deadline:
            raise RuntimeFailure(f"{freezer} did not become {value} within {timeout} s")
        time.sleep(0.0002)
    return before


def _v2_frozen(cgroup: Path) -> str:
    return "1" if "frozen 1" in (cgroup / "cgroup.events").read_text() else "0"


def _empty(freezer: Path, timeout: float = 10.0) -> None:
    """SIGKILL whatever is left in the sandbox's freezer cgroup and wait until it is empty."""
    procs, state = freezer / "cgroup.procs", freezer / "freezer.state"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in procs.read_text().split()]
        except FileNotFoundError:
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        if state.exists() and state.read_text().strip() != "THAWED":
            state.write_text("THAWED")  # SIGKILL is delivered on thaw
        time.sleep(0.002)
    raise RuntimeFailure(f"processes are left in {freezer} after {timeout} s")
