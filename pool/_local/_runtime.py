"""The local runtime: local sandboxes (`_core`) plus snapshots to zero and the recovery after a restart.

`snapshot` records the intent (`snapshot.json`) first, checkpoints with CRIU when the start-up trial passed,
and otherwise (or when the dump fails) just kills the processes: the writable layer stays either way.
`restore` brings the memory image back, or starts the sandbox again over its files (same uid slot, same
pinned layers) and re-runs `/init`, the template's start commands and the sandbox's own autostart command
(`pool._autostart`). The record goes only once the sandbox runs again, so a crash at any point leaves a state
`recover` can finish or undo (`_snapshots.settle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

import msgspec

from executor.envd import ENVD_PORT
from pool._errors import CheckpointFailed, RuntimeFailure, SandboxGone
from pool._executor_client import post_init
from pool._local._census import foreign_processes
from pool._local._core import LocalRuntimeSettings, LocalSandboxes, crash_reason, record_snapshot
from pool._local._criu import CriuBinary
from pool._local._criu_sandbox import checkpoint, restore
from pool._local._forks import ForkSource, keep_memory_image, kept_memory_image, place_fork, take_fork_image
from pool._local._sandbox import Sandbox, load_sandbox, tree_size
from pool._local._snapshots import CriuSupport, drop_image, settle
from pool._local._template_builder import LocalTemplateBuilder
from pool._runtime import (
    BuildLog,
    EgressRules,
    ForkImage,
    RegistryLogin,
    RuntimeCapabilities,
    SandboxSpec,
    SnapshotInfo,
    SnapshotKind,
)
from pool._template_start import wait_for_ports
from pool._templates import Template, has_sandboxed_layers

__all__ = ["LocalRuntime", "LocalRuntimeSettings"]

_PARTIAL = ".partial-"  # a memory image being taken

_log = logging.getLogger("pool.local")


class LocalRuntime(LocalSandboxes):
    """Implements `pool.Runtime` on this machine: bubblewrap sandboxes, snapshotted with CRIU or to their files."""

    def __init__(self, settings: LocalRuntimeSettings, *, parent_cgroup: str) -> None:
        super().__init__(settings, parent_cgroup=parent_cgroup)
        self._criu = CriuSupport(settings.criu_dir)  # the trial runs in a thread meanwhile
        # Sandboxes whose memory snapshot failed since they started: the idle policy leaves them frozen.
        self._dump_failed: set[str] = set()
        self._crashes: dict[str, str] = {}  # found by `recover`: pid 1 died while no server watched, and why
        self._builder = LocalTemplateBuilder(self)
        # Fork images live as long as the fork request that took them: any found at start were a crash's.
        self._fork_images = settings.data_dir / "fork-images"
        shutil.rmtree(self._fork_images, ignore_errors=True)
        self._fork_sources: dict[str, ForkSource] = {}
        self._memory_images = settings.data_dir / "memory-images"  # snapshots with memory: kept until dropped
        for partial in self._memory_images.glob(f"{_PARTIAL}*"):  # a crash's, while one was taken
            shutil.rmtree(partial, ignore_errors=True)
        self._image_users: Counter[str] = Counter()  # memory image -> creates copying it now
        self._doomed: set[str] = set()  # memory images dropped while copied: removed once the last copy is made

    async def build_template(
        self,
        template: Template,
        log: BuildLog,
        *,
        files: Callable[[str], Path],
        within: float,
        registry: RegistryLogin | None = None,
    ) -> Template:
        """`pool.TemplateBuilder`: layers built here, the sandboxed ones in build sandboxes (`_template_builder`)."""
        return await self._builder.build_template(template, log, files=files, within=within, registry=registry)

    async def snapshot_files(self, sandbox_id: str, template: Template, name: str) -> Template:
        """`pool.TemplateBuilder`: a template over the running sandbox's files as they are now (`_template_builder`)."""
        return await self._builder.snapshot_files(sandbox_id, template, name)

    async def snapshot_memory(
        self, sandbox_id: str, template: Template, name: str, access_token: str | None
    ) -> Template:
        """`pool.TemplateBuilder`: a fork image of the running sandbox kept under `memory-images/` (`_forks`)."""
        box = self._running(sandbox_id)
        criu = await self._criu.binary()
        if criu is None:
            raise RuntimeFailure(await self.fork_refusal())
        await self._builder.pin_generation(sandbox_id, template, name, box.layers())
        key = secrets.token_hex(16)
        self._memory_images.mkdir(mode=0o700, exist_ok=True)
        self._memory_images.chmod(0o700)  # also when an older server made it with the umask's mode
        partial = self._memory_images / f"{_PARTIAL}{key}"  # a crash leaves no image that looks whole
        keep = self.workers.run(self.workers.snapshots, keep_memory_image, criu, box, partial, access_token)
        kept = await self._image_or_undo(keep, partial)
        partial.rename(self._memory_images / key)
        _log.info(
            "sandbox %s: memory image %s in %.0f ms, %d bytes", sandbox_id, key, kept.seconds * 1000, kept.image_bytes
        )
        return msgspec.structs.replace(template, name=name, memory_image=key)

    async def snapshot_bytes(self, template: Template) -> int:
        """`pool.TemplateBuilder`: the size of the template's memory image, or of its own snapshot layer."""
        path = self._memory_images / template.memory_image if template.memory_image else None
        path = path or self._builder.snapshot_layer(template)
        return 0 if path is None else await self.workers.run(self.workers.snapshots, tree_size, path)

    async def drop_snapshot_files(self, template: Template) -> None:
        """`pool.TemplateBuilder`: the template's memory image, or its own snapshot layer, goes."""
        if key := template.memory_image:
            if self._image_users[key]:
                self._doomed.add(key)
            else:
                await self._remove_memory_image(key)
        else:
            await self._builder.drop_snapshot_files(template)

    async def criu_trial(self) -> None:
        """Return once the CRIU trial (a thread started with the runtime) has finished."""
        await self._criu.status()

    def capabilities(self) -> RuntimeCapabilities:
        """What snapshots keep on this machine (the CRIU trial's result; "filesystem" while it runs)."""
        status = self._criu.status_now()
        if status is None:
            return RuntimeCapabilities(snapshot_kind="filesystem", criu_reason="the CRIU trial is still running")
        kind: SnapshotKind = "criu" if status.available else "filesystem"
        return RuntimeCapabilities(snapshot_kind=kind, criu_version=status.version, criu_reason=status.reason)

    async def set_egress(self, sandbox_id: str, rules: EgressRules) -> None:
        """Replace the running sandbox's rules (`pool._local._egress`); its connections they now deny are cut.
        SandboxGone when it does not run."""
        await self._set_egress(sandbox_id, rules)

    def note_spec(self, spec: SandboxSpec) -> None:
        """Nothing to keep: freeze, stats and snapshot go through cgroups and files, and `restore` gets the spec."""

    async def build_builtin(self, template: Template, log: Callable[[str], None]) -> None:
        """Build an operator's template's missing layers: on the host, or in build sandboxes (then started once)
        when it has sandboxed layers. A built-in template names no uploaded files (TemplateBuildFailed if one does):
        its copy layers are packed from its templates directory."""
        if not has_sandboxed_layers(template):
            await self.workers.run(self.workers.builds, self.images.build, template, log)
            return

        def no_uploads(files_hash: str) -> Path:
            raise KeyError(f"a built-in template names uploaded files {files_hash}")

        await self.build_template(template, lambda _layer, _level, line: log(line), files=no_uploads, within=3600)

    async def fork_refusal(self) -> str:
        """`pool.Forker`: forks keep memory, so they need the CRIU that passed the start-up trial (awaited: it
        takes a second at most, and a refusal meanwhile would read as for good)."""
        status = await self._criu.status()
        return "" if status.available else f"memory is imaged with CRIU, which does not work here: {status.reason}"

    async def fork_image(self, sandbox_id: str, access_token: str | None) -> ForkImage:
        """`pool.Forker`: CRIU's image of the running sandbox and a copy of its writable layer (`_forks`)."""
        box = self._running(sandbox_id)
        criu = await self._criu.binary()
        if criu is None:
            raise RuntimeFailure(await self.fork_refusal())
        key = secrets.token_hex(8)
        take = self.workers.run(self.workers.snapshots, take_fork_image, criu, box, self._fork_images / key)
        source = self._fork_sources[key] = await self._image_or_undo(take, self._fork_images / key)
        _log.info("sandbox %s: fork image in %.0f ms, %d bytes", sandbox_id, source.seconds * 1000, source.image_bytes)
        return ForkImage(
            source_id=sandbox_id, key=key, access_token=access_token, seconds=source.seconds,
            image_bytes=source.image_bytes,
        )  # fmt: skip

    async def _image_or_undo(self, taking: Awaitable[ForkSource], directory: Path) -> ForkSource:
        """What the thread `taking` an image into `directory` returns; cancelled meanwhile, the image it goes on
        to make is removed once it is made."""
        work = asyncio.ensure_future(taking)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await work
            await self.workers.run(self.workers.snapshots, shutil.rmtree, directory, True)
            raise

    async def drop_fork_image(self, image: ForkImage) -> None:
        """`pool.Forker`: the image goes; its forks have their own copies."""
        self._fork_sources.pop(image.key, None)
        await self.workers.run(self.workers.snapshots, shutil.rmtree, self._fork_images / image.key, True)

    async def start(self, spec: SandboxSpec) -> None:
        """A sandbox from its template; with `spec.fork`, a copy of that image restored into a slot of its own, and
        from a snapshot with memory, a copy of its kept image the same way."""
        if spec.fork is not None:
            image = spec.fork
            source = self._fork_sources.get(image.key)
            if source is None:
                raise RuntimeFailure(f"the image of sandbox {image.source_id} that {spec.sandbox_id} forks is gone")
            await self._start_fork(spec, self._fork_images / image.key, source, image.access_token)
        elif key := spec.template.memory_image:
            if key in self._doomed:
                raise RuntimeFailure(
                    f"the snapshot {spec.template.name} that sandbox {spec.sandbox_id} is from is deleted"
                )
            directory = self._memory_images / key
            self._image_users[key] += 1
            try:
                source = await self.workers.run(self.workers.lifecycle, kept_memory_image, directory)
                await self._start_fork(spec, directory, source, source.access_token)
            finally:
                self._image_users[key] -= 1
                if not self._image_users[key]:
                    del self._image_users[key]
                    if key in self._doomed:
                        self._doomed.discard(key)
                        await self._remove_memory_image(key)
        else:
            await super().start(spec)

    async def forget_memory_images(self, keep: set[str]) -> None:
        """`pool.TemplateBuilder`: the memory images no snapshot names go (those being taken are partial)."""

        def sweep() -> list[str]:
            found = list(self._memory_images.iterdir()) if self._memory_images.is_dir() else []
            unnamed = [path for path in found if path.name not in keep and not path.name.startswith(_PARTIAL)]
            for path in unnamed:
                shutil.rmtree(path, ignore_errors=True)
            return [path.name for path in unnamed]

        if removed := await self.workers.run(self.workers.snapshots, sweep):
            _log.warning("removed memory images no snapshot names: %s", ", ".join(removed))

    async def _remove_memory_image(self, key: str) -> None:
        await self.workers.run(self.workers.snapshots, shutil.rmtree, self._memory_images / key, True)

    async def _start_fork(self, spec: SandboxSpec, directory: Path, source: ForkSource, token: str | None) -> None:
        """Start `spec`'s sandbox as a copy of the image in `directory`, whose executor wants `token`."""
        if spec.sandbox_id in self._sandboxes or spec.sandbox_id in self._preparing:
            return
        criu = await self._criu.binary()
        if criu is None:
            raise RuntimeFailure(f"sandbox {spec.sandbox_id} is a copy of a memory image: {await self.fork_refusal()}")
        self._egress.policy(spec.egress)  # rules that do not parse fail here, before anything starts
        layers = [Path(layer) for layer in source.layers]
        if gone := [layer.name for layer in layers if not layer.is_dir()]:
            raise RuntimeFailure(
                f"the image sandbox {spec.sandbox_id} is a copy of stands on layers that are gone: {gone}"
            )
        resources = source.resources or spec.template.resources
        box = await self._prepared(spec.sandbox_id, layers, resources)
        try:
            # On a pool of their own: forks hold up no other sandbox's create, kill or wake-up.
            await self.workers.run(self.workers.copies, place_fork, directory, source, box)
            box.cgroup.create(resources)
            box.pid = await self.workers.run(
                self.workers.copies, restore, criu, sandbox_dir=box.directory, layers=layers, userns_slot=box.slot,
                cgroup_procs=box.cgroup.procs_files(), freezer=box.cgroup.freezer_path(),
            )  # fmt: skip
            self._adopt(box)
            await self.workers.run(self.workers.snapshots, drop_image, box.directory)
            await self._connect(box, spec.egress)
            connect = functools.partial(self.open_socket, spec.sandbox_id)
            # The copy's own token from now on; "" takes the image's away from one that is to have none.
            init = msgspec.structs.replace(spec.init, access_token=spec.init.access_token or "")
            await post_init(await connect(ENVD_PORT), init, token)
            await wait_for_ports(connect, spec.template, within=self._settings.ports_timeout)
            box.set_start_pids(list(source.start_pids))
        except BaseException:
            await self.stop(spec.sandbox_id)
            raise

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        self._dump_failed.discard(sandbox_id)
        self._crashes.pop(sandbox_id, None)
        await super().stop(sandbox_id, keep_files=keep_files)

    def snapshot_keeps_processes(self, sandbox_id: str) -> bool:
        """Whether a snapshot now would keep every process: no after a memory snapshot of it failed."""
        if sandbox_id in self._dump_failed:
            return False
        return self._criu_would_keep(sandbox_id)

    def _criu_would_keep(self, sandbox_id: str) -> bool:
        if sandbox_id in self._snapshots:
            return True
        box = self._running(sandbox_id)
        status = self._criu.status_now()
        if status is not None and status.available:
            return True
        return not foreign_processes(box.cgroup.pids(), box.start_pids())

    def is_snapshotted(self, sandbox_id: str) -> bool:
        return sandbox_id in self._snapshots

    def snapshotted_ids(self) -> set[str]:
        return set(self._snapshots)

    async def snapshot(self, sandbox_id: str, *, memory: bool = True) -> SnapshotInfo:
        if (done := self._snapshots.get(sandbox_id)) is not None:
            return done
        box = self._running(sandbox_id)
        criu = await self._criu.binary() if memory else None
        started = time.monotonic()
        box.stopping = True  # from here on its end is no crash
        self._egress.detach(sandbox_id)  # its proxied connections end first: their host ends are not in an image
        kind: SnapshotKind = "criu" if criu is not None else "filesystem"
        await self.workers.run(
            self.workers.lifecycle, box.set_snapshot_info, SnapshotInfo(kind=kind, seconds=0.0, image_bytes=0)
        )
        if criu is not None and not await self._checkpoint(box, criu):
            if foreign_processes(box.cgroup.pids(), box.start_pids()):
                await self._run_on(box)
                raise CheckpointFailed(f"sandbox {sandbox_id}: its memory could not be snapshotted (CRIU)")
            kind = "filesystem"  # only the template's own processes ran: its start commands bring them back
        del self._sandboxes[sandbox_id]
        await self.workers.run(self.workers.lifecycle, self._teardown, box, True)
        seconds = time.monotonic() - started
        info = self._snapshots[sandbox_id] = await self.workers.run(
            self.workers.snapshots, record_snapshot, box, kind, seconds
        )
        _log.info("sandbox %s: snapshot (%s) in %.0f ms, %d bytes", sandbox_id, kind, seconds * 1000, info.image_bytes)
        return info

    async def _run_on(self, box: Sandbox) -> None:
        """Undo a snapshot's first steps after its dump failed: the sandbox runs on, reachable as before."""
        box.stopping = False
        await self.workers.run(self.workers.lifecycle, box.set_snapshot_info, None)
        self._dump_failed.add(box.sandbox_id)
        await self._connect(box, await self.workers.run(self.workers.lifecycle, box.egress_rules))

    async def _checkpoint(self, box: Sandbox, criu: CriuBinary) -> bool:
        """Dump the sandbox's memory with CRIU; on failure it is left as it was and only its files are kept."""
        freezer = box.cgroup.freezer_path()
        try:
            await self.workers.run(
                self.workers.snapshots, checkpoint, criu, sandbox_dir=box.directory, pid=box.pid, freezer=freezer
            )
        except RuntimeFailure as exc:
            _log.warning("sandbox %s: checkpoint failed, the snapshot keeps its files only: %s", box.sandbox_id, exc)
            return False
        return True

    async def restore(self, spec: SandboxSpec, *, memory: bool = True) -> None:
        sandbox_id = spec.sandbox_id
        if sandbox_id in self._sandboxes:
            return
        info = self._snapshots.get(sandbox_id)
        box = load_sandbox(self._root / sandbox_id, self._cgroups) if info else None
        if info is None or box is None:
            raise SandboxGone(f"sandbox {sandbox_id} is not snapshotted")
        layers = self._pinned_layers(box)
        if info.kind == "criu" and not memory:  # a cold boot: the image goes for good, the files stay
            info = self._snapshots[sandbox_id] = await self.workers.run(self.workers.snapshots, _downgrade, box)
        self._sandboxes[sandbox_id] = box
        try:
            await self.workers.run(
                self.workers.lifecycle, self._disks.attach, box.directory
            )  # mounted still, unless the host rebooted
            box.cgroup.create(box.resources)
            if info.kind == "criu" and await self._restore_memory(box, layers):
                await self._connect(box, spec.egress)
                connect = functools.partial(self.open_socket, sandbox_id)
                await wait_for_ports(connect, spec.template, within=self._settings.ports_timeout)
            else:
                await self._launch(box, layers)
                await self._connect(box, spec.egress)
                await self._bring_up(box, spec, autostart=True)
        except BaseException:
            self._sandboxes.pop(sandbox_id, None)
            box.stopping = True
            await self.workers.run(
                self.workers.lifecycle, self._teardown, box, True
            )  # still snapshotted: its record is untouched
            raise
        del self._snapshots[sandbox_id]
        await self.workers.run(self.workers.snapshots, _forget_snapshot, box)

    @staticmethod
    def _pinned_layers(box: Sandbox) -> list[Path]:
        try:
            layers = box.layers()
        except (OSError, msgspec.DecodeError) as exc:
            raise RuntimeFailure(f"sandbox {box.sandbox_id} cannot come back: its layers are not recorded") from exc
        missing = [str(layer) for layer in layers if not layer.is_dir()]
        if missing:
            raise RuntimeFailure(f"sandbox {box.sandbox_id} cannot come back: its template layers are gone: {missing}")
        return layers

    async def _restore_memory(self, box: Sandbox, layers: list[Path]) -> bool:
        """Restore the CRIU image; when that fails, fall back to the files (recorded so) and return False."""
        criu = await self._criu.binary()
        try:
            if criu is None:
                raise RuntimeFailure(f"CRIU does not work here: {(await self._criu.status()).reason}")
            box.pid = await self.workers.run(
                self.workers.snapshots, restore, criu, sandbox_dir=box.directory, layers=layers, userns_slot=box.slot,
                cgroup_procs=box.cgroup.procs_files(), freezer=box.cgroup.freezer_path(),
            )  # fmt: skip
        except RuntimeFailure as exc:
            _log.warning("sandbox %s: memory image not restored, starting over its files: %s", box.sandbox_id, exc)
            self._snapshots[box.sandbox_id] = await self.workers.run(self.workers.snapshots, _downgrade, box)
            return False
        self._adopt(box)
        return True

    async def recover(self) -> set[str]:
        """Re-adopt sandboxes whose processes outlived a restart of the server, find the snapshotted ones, and
        finish what a crash interrupted: an interrupted snapshot is completed, an interrupted restore undone."""
        await self._criu.status()  # known before anything is snapshotted or restored
        alive: set[str] = set()
        for directory in sorted(self._root.iterdir()):
            box = load_sandbox(directory, self._cgroups)
            if box is None:
                shutil.rmtree(directory, ignore_errors=True)  # died before its slot was recorded
                continue
            found = await self.workers.run(self.workers.snapshots, self._settle, box)
            if isinstance(found, _Crashed):
                self._snapshots[box.sandbox_id] = found.files
                self._crashes[box.sandbox_id] = found.why
            elif isinstance(found, SnapshotInfo):
                self._snapshots[box.sandbox_id] = found
            elif found:
                box.pid = found
                self._adopt(box)
                self._sandboxes[box.sandbox_id] = box
                alive.add(box.sandbox_id)
                await self._reconnect(box)
        return alive

    async def _reconnect(self, box: Sandbox) -> None:
        """A re-adopted sandbox's table and route are still in its namespace; the host's sockets there died with
        the previous server and are made again, under the rules it last had."""
        try:
            await self._connect(box, box.egress_rules())
        except (RuntimeFailure, OSError) as exc:
            _log.warning("sandbox %s: its egress could not be set up again, it has none: %s", box.sandbox_id, exc)

    def crashes(self) -> dict[str, str]:
        """`pool.Runtime`: the sandboxes `recover` found with their pid 1 gone, kept as their files (and not yet
        started again), and why."""
        return {sandbox_id: why for sandbox_id, why in self._crashes.items() if sandbox_id in self._snapshots}

    def _settle(self, box: Sandbox) -> SnapshotInfo | int | _Crashed:
        """What one sandbox directory holds after a restart (blocking): a snapshot, a live pid 1, or what is left
        of a sandbox whose pid 1 died meanwhile."""
        recorded = box.snapshot_info()
        pid = box.recorded_pid()
        if recorded is not None:
            try:
                self._disks.attach(box.directory)  # after a reboot
            except RuntimeFailure as exc:  # only this sandbox's restore will fail, not the server's start
                _log.warning("sandbox %s: %s", box.sandbox_id, exc)
            info = settle(box, recorded)
            if recorded.kind == "criu" and info.kind == "filesystem" and pid and pid in box.cgroup.pids():
                # Its memory dump was cut off (half an image, discarded) while its processes were still there,
                # frozen: they are kept, not lost to a files-only snapshot. The caller snapshots it again.
                box.set_snapshot_info(None)
                return pid
            box.stopping = True
            self._teardown(box, keep_files=True)
            return info
        if pid and pid in box.cgroup.pids():
            drop_image(box.directory)  # left by a restore that was complete
            return pid
        oom_kills = 0
        if box.cgroup.exists():
            with contextlib.suppress(OSError):
                oom_kills = box.cgroup.oom_kills()
            box.stopping = True
            self._teardown(box, keep_files=True)
        if not pid:  # its start never got as far as running it: nothing of its own to keep
            return 0
        return self._keep_crashed(box, oom_kills)

    def _keep_crashed(self, box: Sandbox, oom_kills: int) -> _Crashed | int:
        """Its pid 1 ended while no server watched (or the machine restarted): like any crash, its files stay, as
        a files-only snapshot (blocking); 0 (dead, to be removed) when they could not start a sandbox again."""
        try:
            self._disks.attach(box.directory)  # after a reboot; its size is its filesystem's use
            missing = [str(path) for path in (box.directory / "upper", *box.layers()) if not path.is_dir()]
            if missing:
                raise RuntimeFailure(f"it cannot start again, {', '.join(missing)} missing")
            files = record_snapshot(box)
        except (RuntimeFailure, OSError) as exc:  # the disk full, a damaged image: it is lost, as before
            _log.warning("sandbox %s: its pid 1 ended while no server ran; not kept: %s", box.sandbox_id, exc)
            return 0
        why = crash_reason(box, "ended while the server was not running", oom_kills)
        _log.warning("sandbox %s crashed: %s; its files are kept", box.sandbox_id, why)
        return _Crashed(files, why)


class _Crashed(NamedTuple):
    """A sandbox `recover` found dead: its files, kept as its snapshot, and why it is no longer running."""

    files: SnapshotInfo
    why: str


def _forget_snapshot(box: Sandbox) -> None:
    """The sandbox runs again: first its record goes (a crash now leaves a running sandbox), then the image."""
    box.set_snapshot_info(None)
    drop_image(box.directory)


def _downgrade(box: Sandbox) -> SnapshotInfo:
    """A memory image that cannot (or must not) be restored is dropped: the snapshot keeps the sandbox's files only."""
    drop_image(box.directory)
    recorded = box.snapshot_info()
    return record_snapshot(box, "filesystem", recorded.seconds if recorded else 0.0)
