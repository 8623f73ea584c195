"""The local runtime: each sandbox is a bubblewrap process tree in its own namespaces and cgroups."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from pool._errors import ImageBuildError, PortClosed, RuntimeFailure, SandboxGone
from pool._executor_client import post_init
from pool._local._cgroups import SandboxCgroup, cgroup_root_for
from pool._local._images import ImageStore
from pool._local._launcher import EXECUTOR_PORT, ROOT_MOUNTPOINT, bwrap_argv, launcher_steps
from pool._local._netns import NetnsSocketFactory
from pool._local._orphans import reap_orphans
from pool._local._seccomp import seccomp_filter
from pool._local._slots import SlotAllocator
from pool._local._syscalls import set_child_subreaper
from pool._local._userns import IDS_PER_SANDBOX, create_userns, host_id_base
from pool._runtime import SandboxSpec, SandboxStats
from pool._templates import Resources

__all__ = ["LocalRuntime", "LocalRuntimeSettings"]

ExitListener = Callable[[str], Awaitable[None]]


class LocalRuntimeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the local runtime keeps its state."""

    data_dir: Path
    image_cache: Path
    executor_source: Path
    slot_dir: Path = Path("/var/lib/agent-sandbox/uid-slots")
    start_timeout: float = 20.0


class _Sandbox:
    """A started sandbox. Owned by the event loop thread; `netns_fd` is closed when it stops."""

    __slots__ = (
        "cgroup", "directory", "last_cpu", "netns_fd", "pid", "process", "resources", "slot", "stopping", "token",
    )  # fmt: skip

    def __init__(self, directory: Path, slot: int, cgroup: SandboxCgroup, resources: Resources) -> None:
        self.directory = directory
        self.resources = resources
        self.slot = slot
        self.cgroup = cgroup
        self.process: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.netns_fd = -1
        self.token: str | None = None
        self.stopping = False
        self.last_cpu = (time.monotonic(), 0.0)


class LocalRuntime:
    """Implements `pool.Runtime` with bubblewrap, user namespaces, overlayfs and cgroups."""

    def __init__(self, settings: LocalRuntimeSettings, *, parent_cgroup: str) -> None:
        set_child_subreaper()
        self._settings = settings
        self._images = ImageStore(settings.image_cache, settings.executor_source)
        self._cgroups = cgroup_root_for(parent_cgroup)
        self._slots = SlotAllocator(settings.slot_dir)
        self._sockets = NetnsSocketFactory()
        self._seccomp = seccomp_filter()
        ROOT_MOUNTPOINT.mkdir(parents=True, exist_ok=True)
        self._root = settings.data_dir / "sandboxes"
        self._root.mkdir(parents=True, exist_ok=True)
        self._sandboxes: dict[str, _Sandbox] = {}
        self._on_exit: ExitListener | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # crash clean-ups in flight, kept referenced

    @property
    def images(self) -> ImageStore:
        return self._images

    def set_exit_listener(self, listener: ExitListener) -> None:
        """`listener(sandbox_id)` is called when a sandbox's processes end without `stop`."""
        self._on_exit = listener

    async def start(self, spec: SandboxSpec) -> None:
        if spec.sandbox_id in self._sandboxes:
            return
        try:
            layers = self._images.layer_dirs(spec.template)
        except ImageBuildError as exc:
            raise RuntimeFailure(str(exc)) from exc
        box = self._prepare(spec.sandbox_id, layers, spec.template.resources)
        self._sandboxes[spec.sandbox_id] = box
        try:
            box.cgroup.create(spec.template.resources)
            await self._launch(box, layers)
            await post_init(await self.open_socket(spec.sandbox_id, EXECUTOR_PORT), spec.init, None)
            box.token = spec.init.access_token
        except BaseException:
            await self.stop(spec.sandbox_id)
            raise

    def _prepare(self, sandbox_id: str, layers: list[Path], resources: Resources) -> _Sandbox:
        directory = self._root / sandbox_id
        slot = self._slots.take(str(directory))
        base = host_id_base(slot)
        for sub in ("upper", "work", *(f"lower/{i}" for i in range(len(layers)))):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("upper", "work"):
            os.chown(directory / sub, base, base)
        (directory / "slot").write_text(str(slot))
        (directory / "resources.json").write_bytes(msgspec.json.encode(resources))
        # The exact layers, pinned: a snapshot must come back over the files its processes had open.
        (directory / "layers.json").write_bytes(msgspec.json.encode([str(layer) for layer in layers]))
        return _Sandbox(directory, slot, SandboxCgroup(self._cgroups, sandbox_id), resources)

    async def _launch(self, box: _Sandbox, layers: list[Path]) -> None:
        status_r, status_w = os.pipe()
        ready_r, ready_w = os.pipe()
        try:
            box.process = await asyncio.to_thread(self._spawn, box, layers, status_w, ready_w)
        finally:
            os.close(status_w)
            os.close(ready_w)
        try:
            async with asyncio.timeout(self._settings.start_timeout):
                box.pid = json.loads(await _read_line(status_r))["child-pid"]
                if await _read_line(ready_r) != b"ready\n":
                    raise RuntimeFailure(f"sandbox did not start: {self._launcher_log(box)}")
        except (TimeoutError, ValueError, KeyError) as exc:
            raise RuntimeFailure(f"sandbox did not start: {exc!r} {self._launcher_log(box)}") from exc
        finally:
            os.close(status_r)
            os.close(ready_r)
        box.netns_fd = os.open(f"/proc/{box.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        (box.directory / "pid").write_text(str(box.pid))
        self._watch_exit(box)

    def _spawn(self, box: _Sandbox, layers: list[Path], status_w: int, ready_w: int) -> subprocess.Popen[bytes]:
        """Fork the launcher (blocking: runs in a worker thread)."""
        seccomp_r, seccomp_w = os.pipe()
        os.write(seccomp_w, self._seccomp)
        os.close(seccomp_w)
        userns_fd = create_userns(box.slot)
        argv = bwrap_argv(seccomp_fd=seccomp_r, status_fd=status_w, ready_fd=ready_w)
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

    @staticmethod
    def _launcher_log(box: _Sandbox) -> str:
        try:
            return (box.directory / "launcher.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _watch_exit(self, box: _Sandbox) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(box.pid)
        sandbox_id = box.directory.name

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if not box.stopping and self._sandboxes.get(sandbox_id) is box:
                task = loop.create_task(self._after_crash(sandbox_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        loop.add_reader(pidfd, exited)

    async def _after_crash(self, sandbox_id: str) -> None:
        await self.stop(sandbox_id)
        if self._on_exit is not None:
            await self._on_exit(sandbox_id)

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        box = self._sandboxes.pop(sandbox_id, None) or self._find_on_disk(sandbox_id)
        if box is None:
            return
        box.stopping = True
        await asyncio.to_thread(self._teardown, box, keep_files)

    def _find_on_disk(self, sandbox_id: str) -> _Sandbox | None:
        directory = self._root / sandbox_id
        if not (directory / "slot").is_file():
            return None
        slot = int((directory / "slot").read_text())
        resources = msgspec.json.decode((directory / "resources.json").read_bytes(), type=Resources)
        return _Sandbox(directory, slot, SandboxCgroup(self._cgroups, sandbox_id), resources)

    def _teardown(self, box: _Sandbox, keep_files: bool) -> None:
        box.cgroup.kill_all()
        if box.process is not None:
            box.process.wait()
        if box.netns_fd >= 0:
            os.close(box.netns_fd)
            box.netns_fd = -1
        box.cgroup.remove()
        base = host_id_base(box.slot)
        reap_orphans(range(base, base + IDS_PER_SANDBOX))
        (box.directory / "pid").unlink(missing_ok=True)
        if not keep_files:
            shutil.rmtree(box.directory, ignore_errors=True)
            self._slots.release(box.slot)

    def _running(self, sandbox_id: str) -> _Sandbox:
        box = self._sandboxes.get(sandbox_id)
        if box is None or box.netns_fd < 0:
            raise SandboxGone(f"sandbox {sandbox_id} is not running")
        return box

    async def freeze(self, sandbox_id: str) -> None:
        self._running(sandbox_id).cgroup.freeze()

    async def thaw(self, sandbox_id: str) -> None:
        self._running(sandbox_id).cgroup.thaw()

    def is_frozen(self, sandbox_id: str) -> bool:
        return self._running(sandbox_id).cgroup.is_frozen()

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket:
        sock = self._sockets.socket_in(self._running(sandbox_id).netns_fd)
        try:
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        except ConnectionRefusedError as exc:
            sock.close()
            raise PortClosed(f"nothing listens on port {port} in sandbox {sandbox_id}") from exc
        except OSError as exc:
            sock.close()
            raise RuntimeFailure(f"cannot reach port {port} in sandbox {sandbox_id}: {exc}") from exc
        return sock

    def is_running(self, sandbox_id: str) -> bool:
        box = self._sandboxes.get(sandbox_id)
        return box is not None and box.netns_fd >= 0

    def sandbox_ids(self) -> list[str]:
        return list(self._sandboxes)

    def host_pid(self, sandbox_id: str) -> int:
        """The host pid of the sandbox's pid 1 (the executor)."""
        return self._running(sandbox_id).pid

    async def stats(self, sandbox_id: str) -> SandboxStats:
        box = self._running(sandbox_id)
        usage = box.cgroup.usage()
        now = time.monotonic()
        then, cpu_then = box.last_cpu
        box.last_cpu = (now, usage.cpu_seconds)
        res = box.resources
        pct = 100.0 * (usage.cpu_seconds - cpu_then) / max(now - then, 1e-6) / res.cpu_count
        disk = await asyncio.to_thread(_tree_size, box.directory / "upper")
        return SandboxStats(
            cpu_count=res.cpu_count, cpu_used_pct=round(max(pct, 0.0), 2), cpu_seconds=usage.cpu_seconds,
            mem_used=usage.mem_used, mem_total=res.memory_mb << 20, mem_cache=usage.mem_cache,
            disk_used=disk, disk_total=res.disk_mb << 20,
        )  # fmt: skip

    async def recover(self) -> set[str]:
        """Re-adopt sandboxes whose processes outlived a restart of the server; clean up half-started ones."""
        alive: set[str] = set()
        for directory in sorted(self._root.iterdir()):
            box = self._find_on_disk(directory.name)
            if box is None:
                shutil.rmtree(directory, ignore_errors=True)  # died before its slot was recorded
                continue
            pid = _read_int(directory / "pid")
            if pid and pid in box.cgroup.pids():
                box.pid = pid
                box.netns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                self._sandboxes[directory.name] = box
                self._watch_exit(box)
                alive.add(directory.name)
            elif box.cgroup.exists():
                await asyncio.to_thread(self._teardown, box, True)
        return alive

    def close(self) -> None:
        """Release host resources; the parent cgroup goes too once no sandbox is left in it."""
        self._sockets.close()
        for root in set(self._cgroups.values()):
            with contextlib.suppress(OSError):
                root.rmdir()


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


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total
