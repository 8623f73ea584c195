"""Local sandboxes as process trees: each one bubblewrap in its own namespaces and cgroups, over an overlay.

`LocalSandboxes` starts, freezes, reaches and stops them; `LocalRuntime` (`_runtime`) adds snapshots and
the recovery after a restart on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from executor.agent_api import AGENT_STATE_DIR
from pool._autostart import run_autostart
from pool._errors import ImageBuildError, PortClosed, RuntimeFailure, SandboxGone
from pool._local._cgroups import SandboxCgroup, cgroup_root_for
from pool._local._criu import DEFAULT_CRIU_DIR
from pool._local._disk import DiskImages, disk_usage
from pool._local._egress import Egress, EgressSettings
from pool._local._egress_policy import DNS_ADDRESS
from pool._local._images import ImageStore
from pool._local._launcher import EXECUTOR_LOG, ROOT_MOUNTPOINT, VOLUMES_DIR, VOLUMES_FILE, launch, volume_mounts
from pool._local._netns import NetnsSocketFactory
from pool._local._orphans import reap_orphans
from pool._local._sandbox import Sandbox, load_sandbox, tree_size
from pool._local._sandbox_files import SandboxFiles, unlink_beneath
from pool._local._seccomp import seccomp_filter
from pool._local._slots import SlotAllocator
from pool._local._snapshots import snapshot_bytes
from pool._local._syscalls import set_child_subreaper
from pool._local._userns import IDS_PER_SANDBOX, host_id_base
from pool._local._volumes import LocalVolumes
from pool._local._workers import Workers
from pool._runtime import EgressRules, SandboxSpec, SandboxStats, SnapshotInfo, SnapshotKind
from pool._template_start import bring_up
from pool._templates import Resources
from pool._volumes import VolumeMount

__all__ = ["LocalRuntimeSettings", "LocalSandboxes", "crash_reason", "record_snapshot"]

ExitListener = Callable[[str, str], Awaitable[None]]  # (sandbox id, why it ended)
_log = logging.getLogger("pool.local")


class LocalRuntimeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the local runtime keeps its state, and how long it waits."""

    data_dir: Path
    image_cache: Path
    executor_source: Path
    slot_dir: Path = Path("/var/lib/agent-sandbox/uid-slots")
    criu_dir: Path | None = DEFAULT_CRIU_DIR  # where scripts/build-criu installs CRIU; None: files-only snapshots
    start_timeout: float = 20.0
    ports_timeout: float = 30.0  # how long start and restore wait for a template's ports to accept connections
    egress: EgressSettings = EgressSettings()
    ca_certs: Path | None = Path("/usr/local/share/ca-certificates")  # the host's extra CAs sandboxes trust; None: off
    # Each sandbox's writable layer on a filesystem of its template's `disk_mb` (`_disk`); False: plain directories
    # on the data directory's filesystem, with no limit (hosts without loop devices).
    disk_limit: bool = True
    # Refresh generations of templates being rebuilt against the current archives (`images build --refresh`);
    # every other template's is the one recorded in the image cache.
    refreshed: dict[str, int] = {}


class LocalSandboxes:
    """Starts, freezes, reaches and stops sandboxes made of bubblewrap, user namespaces, overlayfs and cgroups."""

    def __init__(self, settings: LocalRuntimeSettings, *, parent_cgroup: str) -> None:
        set_child_subreaper()
        self._settings = settings
        self._images = ImageStore(settings.image_cache, settings.executor_source, refreshed=settings.refreshed)
        self._cgroups = cgroup_root_for(parent_cgroup)
        self._slots = SlotAllocator(settings.slot_dir)
        self._sockets = NetnsSocketFactory()
        self._egress = Egress(settings.egress, self._sockets)
        self._files = SandboxFiles(ca_certs=settings.ca_certs, dns_address=DNS_ADDRESS)
        self._disks = DiskImages(enabled=settings.disk_limit)
        self.workers = Workers()
        self._seccomp = seccomp_filter()
        ROOT_MOUNTPOINT.mkdir(parents=True, exist_ok=True)
        self._root = settings.data_dir / "sandboxes"
        self._root.mkdir(parents=True, exist_ok=True)
        self.volumes = LocalVolumes(settings.data_dir / VOLUMES_DIR, self._disks)
        # Running (or starting) sandboxes, and snapshotted ones. A sandbox is in at most one of the two; both
        # are changed only on the event loop, by the transition methods below.
        self._sandboxes: dict[str, Sandbox] = {}
        self._snapshots: dict[str, SnapshotInfo] = {}
        self._preparing: dict[str, asyncio.Event] = {}  # started, their directory and filesystem still being made
        self._on_exit: ExitListener | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # crash clean-ups in flight, kept referenced
        self._closed = False

    @property
    def images(self) -> ImageStore:
        return self._images

    def set_exit_listener(self, listener: ExitListener) -> None:
        """`listener(sandbox_id, why)` is called when a sandbox's processes end without `stop` or `snapshot`; the
        sandbox is then snapshotted with its files only (`is_snapshotted`) until it is stopped or restored."""
        self._on_exit = listener

    async def start(self, spec: SandboxSpec) -> None:
        if spec.sandbox_id in self._sandboxes or spec.sandbox_id in self._preparing:
            return
        if spec.sandbox_id in self._snapshots:
            raise RuntimeFailure(f"sandbox {spec.sandbox_id} is snapshotted: restore it instead")
        try:
            layers = self._images.layer_dirs(spec.template)
        except ImageBuildError as exc:
            raise RuntimeFailure(str(exc)) from exc
        self._egress.policy(spec.egress)  # rules that do not parse fail here, before anything starts
        box = await self._prepared(spec.sandbox_id, layers, spec.template.resources, spec.volumes)
        try:
            box.cgroup.create(spec.template.resources)
            await self._launch(box, layers)
            await self._connect(box, spec.egress)
            await self._bring_up(box, spec)
        except BaseException:
            await self.stop(spec.sandbox_id)
            raise

    async def _prepared(
        self, sandbox_id: str, layers: list[Path], resources: Resources, volumes: tuple[VolumeMount, ...] = ()
    ) -> Sandbox:
        """`_prepare` in a worker thread, recorded as running once done. A cancelled caller does not stop the
        thread: what it makes is undone before the cancellation goes on; a `stop` meanwhile waits for either."""
        done = self._preparing[sandbox_id] = asyncio.Event()
        prepare = self.workers.run(self.workers.lifecycle, self._prepare, sandbox_id, layers, resources, volumes)
        work = asyncio.ensure_future(prepare)
        try:
            box = await asyncio.shield(work)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.workers.run(self.workers.lifecycle, self._teardown, await work, False)
            raise
        else:
            self._sandboxes[sandbox_id] = box
            return box
        finally:
            del self._preparing[sandbox_id]
            done.set()

    def _prepare(
        self, sandbox_id: str, layers: list[Path], resources: Resources, volumes: tuple[VolumeMount, ...]
    ) -> Sandbox:
        """The sandbox's directory, uid slot, writable layer and the volumes it mounts (blocking: the layer's
        filesystem is made here)."""
        directory = self._root / sandbox_id
        slot = self._slots.take(str(directory))
        box = Sandbox(directory, slot, SandboxCgroup(self._cgroups, sandbox_id), resources)
        base = host_id_base(slot)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "slot").write_text(str(slot))
            (directory / "resources.json").write_bytes(msgspec.json.encode(resources))
            (directory / "layers.json").write_bytes(msgspec.json.encode([str(layer) for layer in layers]))
            if volumes:
                mounts = [(str(self.volumes.files(volume.volume_id)), volume.path) for volume in volumes]
                (directory / VOLUMES_FILE).write_bytes(msgspec.json.encode(mounts))
            self._disks.create(directory, resources.disk_mb, base)
            self._files.write(directory / "upper", base, layers)
        except BaseException:
            self._teardown(box, keep_files=False)
            raise
        return box

    async def _launch(self, box: Sandbox, layers: list[Path]) -> None:
        for files, _ in volume_mounts(box.directory):  # mounted again after a reboot
            await self.workers.run(self.workers.lifecycle, self.volumes.files, Path(files).parent.name)
        await launch(
            box, layers, seccomp=self._seccomp, within=self._settings.start_timeout, pool=self.workers.lifecycle
        )
        box.fresh_netns = True
        self._adopt(box)

    async def _bring_up(self, box: Sandbox, spec: SandboxSpec, *, autostart: bool = False) -> None:
        """/init, the template's start commands (their pids recorded for the census), its ports; then, when
        asked (a restore from files), the sandbox's own autostart command and its ports."""
        connect = functools.partial(self.open_socket, spec.sandbox_id)
        timeout = self._settings.ports_timeout
        pids = await bring_up(connect, spec, ports_timeout=timeout)
        if autostart:
            pids += await run_autostart(connect, spec, ports_timeout=timeout)
        box.set_start_pids(pids)

    async def _connect(self, box: Sandbox, rules: EgressRules) -> None:
        """Give a sandbox whose pid 1 runs its egress (`_egress`), and record the rules for its comebacks."""
        await self._egress.attach(box.sandbox_id, box.netns_fd, rules, fresh=box.fresh_netns)
        box.set_egress_rules(rules)  # tiny: fine on the loop

    async def _set_egress(self, sandbox_id: str, rules: EgressRules) -> None:
        await self._connect(self._running(sandbox_id), rules)

    def _adopt(self, box: Sandbox) -> None:
        """Make a sandbox whose pid 1 runs (started, restored or re-found) reachable, and watch for its end."""
        box.netns_fd = os.open(f"/proc/{box.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        (box.directory / "pid").write_text(str(box.pid))
        self._watch_exit(box)

    def _watch_exit(self, box: Sandbox) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(box.pid)

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            # A restore still in progress (the sandbox is still snapshotted) fails and cleans up by itself,
            # keeping the files; treating its end as a crash here would delete them.
            if (
                not box.stopping
                and not self._closed
                and self._sandboxes.get(box.sandbox_id) is box
                and box.sandbox_id not in self._snapshots
            ):
                task = loop.create_task(self._after_crash(box.sandbox_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

        loop.add_reader(pidfd, exited)

    async def _after_crash(self, sandbox_id: str) -> None:
        """Its pid 1 ended by itself: what is left of it stops, and its files stay as a files-only snapshot (its
        owner sees why, and a restore starts it again over them, until it is killed)."""
        box = self._sandboxes.get(sandbox_id)
        if box is None:  # stopped meanwhile
            return
        oom_kills = 0
        with contextlib.suppress(OSError):  # gone already
            oom_kills = box.cgroup.oom_kills()  # one small file, before its cgroup goes
        await self.stop(sandbox_id, keep_files=True)
        if sandbox_id in self._sandboxes or sandbox_id in self._snapshots:  # started or killed and made again
            return
        try:
            self._snapshots[sandbox_id] = await self.workers.run(self.workers.lifecycle, record_snapshot, box)
        except OSError:  # killed meanwhile: its directory is gone
            return
        if not box.directory.is_dir():
            self._snapshots.pop(sandbox_id, None)
            return
        status = box.process.returncode if box.process is not None else None
        why = crash_reason(box, f"ended with status {status}" if status else "ended", oom_kills)
        _log.warning("sandbox %s crashed: %s; its files are kept", sandbox_id, why)
        if self._on_exit is not None:
            await self._on_exit(sandbox_id, why)

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        if (preparing := self._preparing.get(sandbox_id)) is not None:
            await preparing.wait()  # its directory is complete, or gone, before anything here touches it
        box = self._sandboxes.pop(sandbox_id, None)
        if box is None and keep_files and sandbox_id in self._snapshots:
            return  # nothing runs, and the files are what it keeps
        self._snapshots.pop(sandbox_id, None)
        box = box or load_sandbox(self._root / sandbox_id, self._cgroups)
        self._egress.detach(sandbox_id)
        if box is None:
            return
        box.stopping = True
        await self.workers.run(self.workers.lifecycle, self._teardown, box, keep_files)

    def _teardown(self, box: Sandbox, keep_files: bool) -> None:
        box.cgroup.kill_all()
        if box.process is not None:
            box.process.wait()
        if box.netns_fd >= 0:
            os.close(box.netns_fd)
            box.netns_fd = -1
        box.cgroup.remove()
        base = host_id_base(box.slot)
        if not reap_orphans(range(base, base + IDS_PER_SANDBOX)):  # a restored pid 1 is our child, not the launcher's
            _log.warning("sandbox %s: processes of its uid range outlived its kill", box.sandbox_id)
        (box.directory / "pid").unlink(missing_ok=True)
        if not keep_files:
            self._disks.detach(box.directory)
            shutil.rmtree(box.directory, ignore_errors=True)
            self._slots.release(box.slot)

    def take_writable_layer(self, sandbox_id: str) -> tuple[Path, int]:
        """The writable layer of a sandbox stopped with `keep_files=True`, cleared of what this machine put in it
        (its DNS address, CAs, the executor's log), and the host id its root had (blocking, small)."""
        box = load_sandbox(self._root / sandbox_id, self._cgroups)
        if box is None or sandbox_id in self._sandboxes:
            raise RuntimeFailure(f"sandbox {sandbox_id} has no stopped writable layer")
        self._disks.attach(box.directory)
        upper = box.directory / "upper"
        self._files.take_back(upper, box.layers())
        unlink_beneath(upper, EXECUTOR_LOG.lstrip("/"))
        return upper.resolve(), host_id_base(box.slot)  # on the sandbox's own filesystem, where it has one

    def pinned_layers(self) -> set[Path]:
        """Every layer a sandbox directory of this runtime stands on (blocking, small): running, starting,
        snapshotted, and the build sandboxes'."""
        pinned: set[Path] = set()
        for directory in self._root.iterdir():
            with contextlib.suppress(OSError, msgspec.DecodeError):
                pinned.update(
                    Path(p) for p in msgspec.json.decode((directory / "layers.json").read_bytes(), type=list[str])
                )
        return pinned

    def copy_writable_layer(self, sandbox_id: str, into: Path) -> tuple[int, list[Path]]:
        """Copy the running sandbox's writable layer to `into` (blocking), the sandbox frozen meanwhile so that
        the copy is of one moment, then clear the copy of what this machine put in it (`take_writable_layer`);
        the host id the sandbox's root has, and the layers it stands on. SandboxGone when it does not run."""
        box = self._running(sandbox_id)
        try:
            was_frozen = box.cgroup.is_frozen()
            try:
                box.cgroup.freeze()
                upper = (box.directory / "upper").resolve()  # on the sandbox's own filesystem, where it has one
                subprocess.run(["cp", "-a", "--", str(upper), str(into)], check=True, capture_output=True)
            finally:
                if not was_frozen:
                    with contextlib.suppress(OSError):  # its pid 1 died meanwhile: its cgroup is gone
                        box.cgroup.thaw()
            layers = box.layers()
            self._files.take_back(into, layers)
            unlink_beneath(into, EXECUTOR_LOG.lstrip("/"))
        except subprocess.CalledProcessError as exc:
            why = exc.stderr.decode(errors="replace").strip()
            raise RuntimeFailure(f"the files of sandbox {sandbox_id} could not be copied: {why}") from exc
        except OSError as exc:
            raise RuntimeFailure(f"the files of sandbox {sandbox_id} could not be copied: {exc}") from exc
        return host_id_base(box.slot), layers

    def _running(self, sandbox_id: str) -> Sandbox:
        box = self._sandboxes.get(sandbox_id)
        if box is None or box.netns_fd < 0:
            state = "snapshotted" if sandbox_id in self._snapshots else "not running"
            raise SandboxGone(f"sandbox {sandbox_id} is {state}")
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

    def may_hold_agent_sessions(self, sandbox_id: str) -> bool:
        """Whether the sandbox's own files hold a coding-agent session (`<AGENT_STATE_DIR>/sessions/` in its
        writable layer): one look at the host's side of its files, no request into it (True when unsure)."""
        box = self._sandboxes.get(sandbox_id)
        if box is None:
            return True
        try:
            with os.scandir(box.directory / "upper" / AGENT_STATE_DIR.lstrip("/") / "sessions") as entries:
                return any(True for _ in entries)
        except FileNotFoundError:
            return False
        except OSError:
            return True

    def sandbox_ids(self) -> list[str]:
        """Running sandboxes, oldest first."""
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
        disk = disk_usage(box.directory)  # one statvfs
        if disk is None:  # no filesystem of its own (the limit is off): a walk, off the shared thread pool
            walked = await self.workers.run(self.workers.walks, tree_size, box.directory / "upper")
            disk_used, disk_total = walked, res.disk_mb << 20
        else:
            disk_used, disk_total = disk.bytes_used, disk.bytes_total
        return SandboxStats(
            cpu_count=res.cpu_count, cpu_used_pct=round(max(pct, 0.0), 2), cpu_seconds=usage.cpu_seconds,
            mem_used=usage.mem_used, mem_total=res.memory_mb << 20, mem_cache=usage.mem_cache,
            disk_used=disk_used, disk_total=disk_total,
        )  # fmt: skip

    def close(self) -> None:
        """Release host resources; the parent cgroup goes too once no sandbox is left in it."""
        self._closed = True  # a sandbox's end from now on is the next server's to handle
        self.workers.close()
        self._egress.close()
        self._sockets.close()
        for root in set(self._cgroups.values()):
            with contextlib.suppress(OSError):
                root.rmdir()


def record_snapshot(box: Sandbox, kind: SnapshotKind = "filesystem", seconds: float = 0.0) -> SnapshotInfo:
    """Write down what a stopped sandbox's snapshot holds, with its size (blocking); by default its files only."""
    info = SnapshotInfo(kind=kind, seconds=seconds, image_bytes=snapshot_bytes(box.directory))
    box.set_snapshot_info(info)
    return info


def crash_reason(box: Sandbox, ended: str, oom_kills: int) -> str:
    """What its owner reads about a sandbox whose pid 1 `ended` by itself, with what the OOM killer did in it."""
    why = f"its pid 1 (the executor) {ended}"
    if oom_kills:
        why += f"; the OOM killer ran {oom_kills} times in it (memory limit {box.resources.memory_mb} MiB)"
    return why
