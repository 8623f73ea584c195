"""Template builds on this machine: each missing layer built in turn, the sandboxed kinds in build sandboxes.

A `run`, `npm` or `copy` layer is built in a sandbox of its own over the layers below it: the same bubblewrap,
user namespace, seccomp filter and cgroup limits as any sandbox, and E2B's default egress (package registries
reachable, nothing private). Its command runs as the layer's user through the executor; when it exits 0 the
sandbox is stopped and its writable layer, ids shifted back and this machine's files taken out, becomes the
layer (`ImageStore.commit`). Host-built kinds (debootstrap, apt, pip of the operator's own templates) are built
by the `ImageStore` as before. A layer already in the cache is reused, so a rebuild with one changed step
rebuilds from that step on. Last, the finished template is started once: its start commands must run and its
ready command succeed, as every sandbox created from it will need.

An `OciLayer` is pinned first: its reference resolved to a manifest digest (`_oci.pin`) before any layer key is
computed, so the keys, the cache and the template returned (what sandboxes start from) name that digest, never
a tag that may move. The image's `Env` goes under the template's and its steps' environment, and its
`WorkingDir` becomes the working directory where the plan left it to the image (""; E2B's /home/user when the
image sets none); its `User` is not used, E2B's `user` is.
"""

from __future__ import annotations

import asyncio
import functools
import shlex
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import msgspec

from executor.envd import ENVD_PORT, DataEvent
from pool._errors import ImageBuildError, PoolError, RuntimeFailure, TemplateBuildFailed
from pool._executor_client import run_command, write_file
from pool._local import _oci
from pool._local._core import LocalSandboxes
from pool._local._layer_steps import EXECUTOR_HOME
from pool._runtime import BuildLog, ExecutorInit, RegistryLogin, SandboxSpec
from pool._template_context import ContextError, pack_context
from pool._templates import SANDBOXED_LAYERS, CopyLayer, Layer, NpmLayer, OciLayer, RunLayer, SnapshotLayer, Template

__all__ = ["LocalTemplateBuilder"]

_ARCHIVE = "/tmp/.agent-sandbox-copy.tar"
_CLEANUP = "rm -rf /tmp/* /tmp/.[!.]* /root/.cache /root/.npm/_cacache /var/cache/apt/*.bin; true"
_OUTPUT_TAIL = 2000  # characters of a failed step's output in the error
_DEFAULT_WORKDIR = "/home/user"  # E2B's, where an image names no WorkingDir


class LocalTemplateBuilder:
    """Implements `pool.TemplateBuilder` with the local runtime's sandboxes and image cache."""

    def __init__(self, sandboxes: LocalSandboxes) -> None:
        self._sandboxes = sandboxes

    async def build_template(
        self,
        template: Template,
        log: BuildLog,
        *,
        files: Callable[[str], Path],
        within: float,
        registry: RegistryLogin | None = None,
    ) -> Template:
        images = self._sandboxes.images
        deadline = time.monotonic() + within
        template = await self._pin(template, log, registry)
        plan = images.plan(template)
        for index, (key, layer) in enumerate(plan[:-1]):
            if images.has(key):
                log(index, "info", f"CACHED {_describe(layer)} (layer {key})")
                continue
            started = time.monotonic()
            if not isinstance(layer, SANDBOXED_LAYERS):
                await self._host_layers(template, index + 1, log, registry)
            elif index == 0:
                raise TemplateBuildFailed(f"{_describe(layer)} has no base layer below it", layer=index)
            else:
                await self._host_layers(template, index, log)  # its executor layer, the first time
                await self._in_sandbox(template, index, key, layer, log, files, deadline)
            log(index, "info", f"built layer {key} in {time.monotonic() - started:.1f} s")
        await self._host_layers(template, len(template.layers), log)
        await self._trial_start(template, log, deadline)
        return template

    async def _pin(self, template: Template, log: BuildLog, registry: RegistryLogin | None) -> Template:
        """`template` with its unpinned `OciLayer` base resolved to a digest, seeded with the image's config."""
        base = template.layers[0] if template.layers else None
        if not isinstance(base, OciLayer) or base.digest:
            return template
        try:
            workers = self._sandboxes.workers
            pinned = await workers.run(
                workers.builds, _oci.pin, base.image, registry, lambda line: log(0, "info", line)
            )
        except _oci.RegistryError as exc:
            raise TemplateBuildFailed(_oci.unavailable(base.image, exc), layer=0) from exc
        log(0, "info", f"base: {base.image} is {pinned.digest}")
        workdir = pinned.workdir if pinned.workdir not in ("", "/") else _DEFAULT_WORKDIR

        def seeded(layer: Layer) -> Layer:
            match layer:
                case OciLayer():
                    return msgspec.structs.replace(layer, digest=pinned.digest)
                case RunLayer():
                    return msgspec.structs.replace(
                        layer, env={**pinned.env, **layer.env}, workdir=layer.workdir or workdir
                    )
                case CopyLayer():
                    return msgspec.structs.replace(layer, workdir=layer.workdir or workdir)
                case _:
                    return layer

        return msgspec.structs.replace(
            template, layers=tuple(seeded(layer) for layer in template.layers), env={**pinned.env, **template.env},
            workdir=template.workdir or workdir,
        )  # fmt: skip

    async def snapshot_files(self, sandbox_id: str, template: Template, name: str) -> Template:
        """`pool.TemplateBuilder`: the sandbox's writable layer copied (frozen meanwhile) and committed as the
        `SnapshotLayer` on top of `template`'s layers, in the image cache like any layer. The layers below are
        the ones the sandbox stands on: those of `template` at the refresh generation it was started at."""
        sandboxes, images, pool = self._sandboxes, self._sandboxes.images, self._sandboxes.workers.snapshots
        snapshot = msgspec.structs.replace(  # a sandbox restored from a memory image: its files start afresh here
            template, name=name, layers=(*template.layers, SnapshotLayer(id=uuid.uuid4().hex)), memory_image=""
        )
        scratch = images.scratch()
        try:
            upper = scratch / "upper"
            id_base, pinned = await sandboxes.workers.run(pool, sandboxes.copy_writable_layer, sandbox_id, upper)
            await self.pin_generation(sandbox_id, template, name, pinned)
            key, _ = images.plan(snapshot)[-2]  # the executor layer is the last
            await sandboxes.workers.run(pool, images.commit, key, upper, id_base)
            await sandboxes.workers.run(pool, images.build, snapshot, lambda _line: None)  # its executor layer
        finally:
            await sandboxes.workers.run(pool, shutil.rmtree, scratch, True)
        return snapshot

    async def pin_generation(self, sandbox_id: str, template: Template, name: str, pinned: list[Path]) -> None:
        """Record that the snapshot `name` of the sandbox (started from `template`, standing on the layers
        `pinned`) stands on `template`'s layers of the refresh generation the sandbox was started at, so that
        its own sandboxes and snapshots find them."""
        sandboxes, images = self._sandboxes, self._sandboxes.images
        stood_on = {layer.name for layer in pinned}
        generation = next(
            (g for g in range(images.generation(template.name), -1, -1)
             if all(key in stood_on for key, _ in images.plan(template, generation=g)[:-1])),
            None,
        )  # fmt: skip
        if generation is None:
            raise RuntimeFailure(f"sandbox {sandbox_id} stands on layers its template {template.name!r} no longer has")
        if generation:  # under the cache's lock, which a build elsewhere may hold for minutes: not on the loop
            await sandboxes.workers.run(sandboxes.workers.snapshots, images.record_refresh, {name: generation})

    def snapshot_layer(self, template: Template) -> Path | None:
        """The directory of the template's own snapshot layer, if it is a snapshot of files."""
        images = self._sandboxes.images
        key, layer = images.plan(template)[-2]  # the executor layer is the last
        return images.layer_path(key) if isinstance(layer, SnapshotLayer) else None

    async def drop_snapshot_files(self, template: Template) -> None:
        """`pool.TemplateBuilder`: the directory of the template's own snapshot layer goes from the image cache."""
        sandboxes, images = self._sandboxes, self._sandboxes.images
        path = self.snapshot_layer(template)
        if path is None:
            return

        def remove_unless_pinned() -> None:
            if path not in sandboxes.pinned_layers():  # a sandbox still starting stands on it
                images.remove([path.name])

        await sandboxes.workers.run(sandboxes.workers.snapshots, remove_unless_pinned)

    async def _host_layers(
        self, template: Template, count: int, log: BuildLog, registry: RegistryLogin | None = None
    ) -> None:
        """Build the `count` lowest layers and the executor layer over them (all but the host-built ones are)."""
        below = msgspec.structs.replace(template, layers=template.layers[:count])

        def build() -> list[Path]:
            return self._sandboxes.images.build(below, lambda line: log(count - 1, "info", line), registry=registry)

        try:
            await self._sandboxes.workers.run(self._sandboxes.workers.builds, build)
        except ImageBuildError as exc:
            raise TemplateBuildFailed(str(exc), layer=count - 1) from exc

    async def _in_sandbox(
        self,
        template: Template,
        index: int,
        key: str,
        layer: RunLayer | NpmLayer | CopyLayer,
        log: BuildLog,
        files: Callable[[str], Path],
        deadline: float,
    ) -> None:
        below = _build_sandbox_template(template, index)
        sandbox_id = f"build{uuid.uuid4().hex[:16]}"
        token = uuid.uuid4().hex
        spec = SandboxSpec(sandbox_id=sandbox_id, template=below, init=ExecutorInit(access_token=token))
        sandboxes = self._sandboxes
        try:
            await sandboxes.start(spec)  # E2B's default egress: the registries are reachable
            connect = functools.partial(sandboxes.open_socket, sandbox_id, ENVD_PORT)
            if isinstance(layer, CopyLayer):
                try:
                    archive = await sandboxes.workers.run(sandboxes.workers.builds, _archive, layer, files)
                except ContextError as exc:
                    raise TemplateBuildFailed(f"{_describe(layer)}: {exc}", layer=index) from exc
                except (OSError, KeyError) as exc:
                    raise TemplateBuildFailed(f"{_describe(layer)}: its files were not uploaded", layer=index) from exc
                await write_file(await connect(), _ARCHIVE, archive, user="root", token=token)
            script, user, workdir, env = _command(layer)
            output = _Output(lambda line: log(index, "info", line))
            try:
                end = await run_command(
                    await connect(), script, output, user=user, token=token, cwd=workdir, envs=env,
                    time_limit=max(deadline - time.monotonic(), 1.0),
                )  # fmt: skip
            except RuntimeFailure as exc:
                raise TemplateBuildFailed(f"{_describe(layer)}: {exc}", layer=index) from exc
            output.flush()
            if not end.exited or end.exit_code != 0:
                status = f"exit status {end.exit_code}" if end.exited else end.status or "killed"
                raise TemplateBuildFailed(f"{_describe(layer)} failed ({status}): {output.tail()}", layer=index)
            await run_command(await connect(), _CLEANUP, _ignore, user="root", token=token)
            await sandboxes.stop(sandbox_id, keep_files=True)
            upper, id_base = await sandboxes.workers.run(
                sandboxes.workers.builds, sandboxes.take_writable_layer, sandbox_id
            )
            await sandboxes.workers.run(sandboxes.workers.builds, sandboxes.images.commit, key, upper, id_base)
        except PoolError as exc:
            if isinstance(exc, TemplateBuildFailed):
                raise
            raise TemplateBuildFailed(f"{_describe(layer)}: the build sandbox failed: {exc}", layer=index) from exc
        finally:
            await sandboxes.stop(sandbox_id)

    async def _trial_start(self, template: Template, log: BuildLog, deadline: float) -> None:
        """Start the template as a sandbox would be, so its start and ready commands are known to work."""
        if not template.start and not template.ready:
            return
        sandbox_id = f"build{uuid.uuid4().hex[:16]}"
        init = ExecutorInit(
            env_vars=dict(template.env), access_token=uuid.uuid4().hex, default_user=template.user,
            default_workdir=template.workdir,
        )  # fmt: skip
        ready = f"ready when {template.ready!r} succeeds" if template.ready else "ready once started"
        log(None, "info", f"starting {' && '.join(template.start) or 'nothing'}; {ready}")
        started = time.monotonic()
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 1.0)):
                await self._sandboxes.start(SandboxSpec(sandbox_id=sandbox_id, template=template, init=init))
        except (PoolError, TimeoutError) as exc:
            raise TemplateBuildFailed(f"the start or ready command failed: {exc}", layer=None) from exc
        finally:
            await self._sandboxes.stop(sandbox_id)
        log(None, "info", f"ready after {time.monotonic() - started:.1f} s")


def _build_sandbox_template(template: Template, index: int) -> Template:
    """The template a build sandbox for layer `index` runs: the layers below, nothing started, the build's limits.
    It keeps the template's name, which its layers' keys depend on (`ImageStore.generation`)."""
    return msgspec.structs.replace(
        template, layers=template.layers[:index], start=(), ports=(), ready="", env={}, user="root", workdir="/",
        warm=0, memory_image="",
    )  # fmt: skip


def _archive(layer: CopyLayer, files: Callable[[str], Path]) -> bytes:
    """The tar a copy layer unpacks: packed from its templates directory (a built-in template's), else the
    uploaded one `files` finds (blocking)."""
    if layer.context:
        return pack_context(Path(layer.context), layer.source, layer.files)
    return files(layer.files).read_bytes()


def _command(layer: RunLayer | NpmLayer | CopyLayer) -> tuple[str, str, str, dict[str, str]]:
    """(script, user, working directory, environment) of a sandboxed layer's build command."""
    match layer:
        case RunLayer(script=script, user=user, workdir=workdir, env=env):
            return script, user, workdir, env
        case NpmLayer(packages=packages, global_=global_):
            names = " ".join(shlex.quote(p) for p in packages)
            return f"npm install {'-g ' if global_ else ''}--no-fund --no-audit {names}", "root", "/", {}
        case CopyLayer():
            argv = [_ARCHIVE, layer.source, layer.dest, layer.user, layer.mode, layer.workdir]
            copy = shlex.join(["python3", "-I", f"{EXECUTOR_HOME}/executor/template_copy.py", *argv])
            return f"{copy} && rm -f {_ARCHIVE}", "root", "/", {}


def _describe(layer: Layer | None) -> str:
    match layer:
        case RunLayer(script=script, user=user):
            return f"RUN {script[:300]!r} as {user}"
        case NpmLayer(packages=packages):
            return f"npm install {' '.join(packages)}"
        case CopyLayer(source=source, dest=dest):
            return f"COPY {source} {dest}"
        case OciLayer(image=image, digest=digest):
            return f"image {image}@{digest}"
        case None:
            return "the executor layer"
        case _:
            return f"{type(layer).__name__.removesuffix('Layer').lower()} layer"


def _ignore(_: DataEvent) -> None:
    pass


class _Output:
    """A step's output, logged line by line as it comes and kept (its tail) for the error when it fails."""

    def __init__(self, line: Callable[[str], None]) -> None:
        self._line = line
        self._partial = b""
        self._kept = bytearray()

    def __call__(self, data: DataEvent) -> None:
        chunk = data.stdout or data.stderr or data.pty or b""
        self._kept.extend(chunk)
        del self._kept[: max(len(self._kept) - 4 * _OUTPUT_TAIL, 0)]
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            self._line(line.decode(errors="replace").rstrip("\r"))

    def flush(self) -> None:
        if self._partial:
            self._line(self._partial.decode(errors="replace"))
            self._partial = b""

    def tail(self) -> str:
        return self._kept.decode(errors="replace").strip()[-_OUTPUT_TAIL:] or "no output"
