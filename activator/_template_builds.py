"""Template builds API keys ask for: their records, their logs while they run, and the tags that name them.

A build is requested (`waiting`), started with its plan (`building`, at most `MAX_CONCURRENT_BUILDS` at once),
and ends `ready` (its `pool.Template` joins the catalog under every tag the request named) or `error` (with the
failing step's label and output). Its log is kept in memory while it runs and stored with its record at the
end, at most `MAX_LOG_ENTRIES` entries. A build a restart interrupted is recorded as failed when the server
comes back. The runtime builds (`pool.TemplateBuilder`); a runtime that cannot leaves `refusal` set, and every
build route answers 501 with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import uuid
from collections.abc import Callable, Iterable
from typing import Literal, Protocol, TypeGuard

import msgspec

from activator._catalog import DEFAULT_TAG, TemplateCatalog, build_key
from activator._errors import ActivatorError, InvalidRequest, NotSupported
from activator._logs import LOG_LEVELS, LogLevel
from activator._template_files import TemplateFiles
from activator._template_records import BuildLogEntry, BuildRecord, TemplateLedger, TemplateRecord
from pool import Layer, PoolError, RegistryLogin, SnapshotLayer, Template, TemplateBuilder, TemplateBuildFailed


class BuildPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What a build makes: the template, per layer the step it comes from ("base", "1".., ) and notes (what the
    base turned out to be) for the build log."""

    template: Template
    labels: tuple[str, ...]
    notes: tuple[str, ...] = ()
    registry: RegistryLogin | None = None  # the base image's registry login, for its pull only (never stored)


class MemoryOf(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot keeps the sandbox's memory: what that takes besides its id (its executor's token, which the
    memory image's executor goes on holding)."""

    access_token: str | None = None

    def __repr__(self) -> str:
        return "MemoryOf(access_token=...)"


__all__ = [
    "MAX_CONCURRENT_BUILDS", "MAX_LOG_ENTRIES", "MAX_SNAPSHOTS_PER_KEY", "BuildFailure", "BuildNotFound", "BuildPlan",
    "MemoryOf", "TemplateBuilds", "WarmBuilds",
]  # fmt: skip

_log = logging.getLogger("activator")

MAX_CONCURRENT_BUILDS = 2
MAX_LOG_ENTRIES = 10_000
InUse = Callable[[], Iterable[Template]]  # the templates live sandboxes were started from
MAX_SNAPSHOTS_PER_KEY = 100  # snapshot builds a key may hold: each is a copy of a sandbox's files on the host's disk


class BuildNotFound(ActivatorError):
    status_code = 404


class BuildFailure(Exception):
    """Why a build failed, and the step label it names."""

    def __init__(self, message: str, step: str) -> None:
        super().__init__(message)
        self.message = message
        self.step = step


class WarmBuilds(Protocol):
    """Warm pools that take templates after the start (`pool.WarmPools`): the tagged builds of keys' templates."""

    def add(self, template: Template, target: int) -> None: ...

    async def remove(self, name: str) -> None: ...


class TemplateBuilds:
    """The templates and builds of every key: requests, runs, status, tags and deletion.

    With `warm` pools and `warm_target` > 0, every build a tag names keeps that many sandboxes started (its start
    and ready commands done), so a create from it is a claim, as E2B's creates from a snapshot of the ready build.
    """

    def __init__(
        self,
        catalog: TemplateCatalog,
        ledger: TemplateLedger | None,
        builder: TemplateBuilder | None,
        files: TemplateFiles | None,
        *,
        clock: Callable[[], float],
        build_timeout: float,
        warm: WarmBuilds | None = None,
        warm_target: int = 0,
        snapshot_space: int = 0,
    ) -> None:
        """`snapshot_space`: bytes of disk one key's snapshots may take together (0: unlimited)."""
        self.files = files
        self._catalog = catalog
        self._ledger = ledger
        self._builder = builder
        self._clock = clock
        self._build_timeout = build_timeout
        self._snapshot_space = snapshot_space
        self._builds: dict[str, BuildRecord] = {}  # build id -> record (finished ones too: status is read often)
        self._deleted: dict[str, list[BuildRecord]] = {}  # template id -> builds of a deleted one sandboxes stand on
        self._running: dict[str, list[BuildLogEntry]] = {}  # build id -> its log so far
        self._pending_tags: dict[str, list[str]] = {}  # build id -> the tags it gets once ready
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_BUILDS)
        self._warm = warm if warm_target > 0 else None
        self._warm_target = warm_target
        self._pooled: dict[str, set[str]] = {}  # template id -> the build keys given a warm pool
        self._tasks: set[asyncio.Task[None]] = set()
        self._snapshotting: dict[str, asyncio.Lock] = {}  # owner: one snapshot at a time (its name, count, space)

    @property
    def refusal(self) -> str:
        """Why this server builds no templates ("" when it does)."""
        if self._builder is None or self._ledger is None or self.files is None:
            return (
                "building templates is not supported on this runtime: on kubernetes a template is a container "
                "image, and this server has no registry to push builds to (build images from deploy/Dockerfile.* "
                "and name them in a template's `image`); the local runtime builds them"
            )
        return ""

    async def load(self) -> None:
        """Read every template and build from the store; builds a restart interrupted become failed ones."""
        if self._ledger is None:
            return
        for record, builds in await self._ledger.built_templates():
            if record.deleted:
                self._deleted[record.template_id] = builds
            for build in builds:
                if build.status in ("waiting", "building"):
                    build = msgspec.structs.replace(
                        build, status="error", reason="the server restarted during the build", finished_at=self._clock()
                    )
                    await self._ledger.put_build(build)
                self._builds[build.build_id] = build
            self._catalog.put_built(record, builds)
            if not record.deleted:
                await self._sync_pools(record)
        if self._builder is not None:
            named = {build.template.memory_image for build in self._builds.values() if build.template is not None}
            await self._builder.forget_memory_images(named - {""})

    async def forget_deleted(self, in_use: InUse) -> None:
        """Remove the deleted templates no sandbox stands on any more, and the files of their snapshots (at a start
        of the server, once its sandboxes are known)."""
        standing = {template.name for template in in_use()}
        for template_id, builds in list(self._deleted.items()):
            keys = {build_key(template_id, build.build_id) for build in builds}
            if keys & standing:
                continue
            await self._ready().delete_template(template_id)
            del self._deleted[template_id]
            await self._drop_files(builds, in_use)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # requests

    async def request(
        self, owner: str, name: str, tags: list[str], *, cpu_count: int, memory_mb: int
    ) -> tuple[TemplateRecord, BuildRecord]:
        """A new build of `owner`'s template `name` (made when it is new), to be tagged `tags` once ready."""
        ledger = self._ready()
        if self._catalog.is_builtin(name):
            raise InvalidRequest(f"'{name}' is a built-in template's name: choose another one")
        now = self._clock()
        record = self._catalog.find_built(owner, name) or TemplateRecord(
            template_id=_template_id(), owner=owner, name=name, created_at=now, updated_at=now
        )
        build = BuildRecord(
            build_id=str(uuid.uuid4()), template_id=record.template_id, status="waiting", created_at=now,
            cpu_count=cpu_count, memory_mb=memory_mb,
        )  # fmt: skip
        await ledger.put_template(record)
        await ledger.put_build(build)
        self._catalog.put_built(record)
        self._builds[build.build_id] = build
        self._pending_tags[build.build_id] = tags or [DEFAULT_TAG]
        return record, build

    async def snapshot(
        self, owner: str, name: str, tag: str, sandbox_id: str, template: Template, in_use: InUse,
        *, memory: MemoryOf | None = None,
    ) -> TemplateRecord:  # fmt: skip
        """A snapshot of `owner`'s running sandbox (started from `template`) as a template: a new one named `name`
        ("": by its template ID), or a new build of `owner`'s snapshot of that name, tagged `tag` (the files of
        the build the tag named before go, unless `in_use()` or another tag needs them). Its files, or with
        `memory` its memory and files (`TemplateBuilder.snapshot_memory`). Nothing is stored unless they were
        taken (the caller keeps the sandbox from changing state meanwhile).
        """
        ledger = self._ready()
        assert self._builder is not None
        if name and self._catalog.is_builtin(name):
            raise InvalidRequest(f"'{name}' is a built-in template's name: choose another one")
        async with self._snapshotting.setdefault(owner, asyncio.Lock()):
            existing = self._catalog.find_built(owner, name) if name else None
            if existing is not None and not existing.snapshot_of:
                raise InvalidRequest(f"'{name}' is one of this key's templates, not a snapshot: choose another name")
            held = sum(len(set(record.tags.values())) for record in self.snapshots(owner))
            if held >= MAX_SNAPSHOTS_PER_KEY and not (existing and tag in existing.tags):  # a new tag adds one
                raise InvalidRequest(f"this key holds {held} snapshots, the most it may: delete some first")
            self._check_snapshot_space(owner, 0)
            template_id = existing.template_id if existing else _template_id()
            build_id, now = str(uuid.uuid4()), self._clock()
            key = build_key(template_id, build_id)
            try:
                if memory is None:
                    taken = await self._builder.snapshot_files(sandbox_id, template, key)
                else:
                    taken = await self._builder.snapshot_memory(sandbox_id, template, key, memory.access_token)
            except PoolError as exc:
                raise ActivatorError(f"the snapshot of sandbox {sandbox_id} failed: {exc}") from exc
            try:
                size = await self._builder.snapshot_bytes(taken)
                self._check_snapshot_space(owner, size)
            except BaseException:
                with contextlib.suppress(Exception):
                    await self._builder.drop_snapshot_files(taken)
                raise
            done = self._clock()
            kept = "files only" if memory is None else "memory and files"
            build = BuildRecord(
                build_id=build_id, template_id=template_id, status="ready", created_at=now, finished_at=done,
                template=taken, logs=(_entry(done, "info", f"snapshot of sandbox {sandbox_id} ({kept})"),),
                cpu_count=template.resources.cpu_count, memory_mb=template.resources.memory_mb, disk_bytes=size,
            )  # fmt: skip
            # Read again: the template may have been deleted or retagged while the files were copied.
            record = self._catalog.find_built(owner, template_id) or TemplateRecord(
                template_id=template_id, owner=owner, name=name or template_id, created_at=now, updated_at=now
            )
            replaced = record.tags.get(tag)
            record = msgspec.structs.replace(
                record, tags={**record.tags, tag: build_id}, updated_at=done, snapshot_of=sandbox_id
            )
            try:
                await ledger.put_template(record)
                await ledger.put_build(build)
            except BaseException:  # what was taken is nobody's: it must not stay on the disk
                with contextlib.suppress(Exception):
                    await self._builder.drop_snapshot_files(taken)
                raise
            self._builds[build_id] = build
            self._catalog.put_built(record, [build])
            await self._sync_pools(record)
        if replaced is not None and replaced not in record.tags.values():
            await self._drop_files([self._builds[replaced]], in_use)
        return record

    def _check_snapshot_space(self, owner: str, adding: int) -> None:
        """InvalidRequest when `owner`'s snapshots fill their space, or would overfill it with `adding` more
        bytes (a build a retag replaces still counts: its files go only after the new ones are in)."""
        if not self._snapshot_space:
            return
        builds = {build for record in self.snapshots(owner) for build in record.tags.values()}
        held = sum(self._builds[build].disk_bytes for build in builds if build in self._builds)
        if held >= self._snapshot_space or held + adding > self._snapshot_space:
            this = f" and this one {adding / (1 << 20):.1f} MiB" if adding else ""
            raise InvalidRequest(
                f"this key's snapshots take {held / (1 << 20):.1f} MiB of disk{this}, over the "
                f"{self._snapshot_space >> 20} MiB they may: delete some first"
            )

    def snapshots(self, owner: str) -> list[TemplateRecord]:
        """`owner`'s snapshot templates, oldest first."""
        return [record for record in self._catalog.built(owner) if record.snapshot_of]

    def newest_tag(self, record: TemplateRecord) -> str:
        """The tag of the template's newest tagged build (what a listing names it by)."""
        return max(record.tags, key=lambda tag: (self._builds[record.tags[tag]].created_at, tag == DEFAULT_TAG))

    async def _drop_files(self, builds: Iterable[BuildRecord], in_use: InUse) -> None:
        """Delete the files each of these snapshot builds took, unless a template `in_use()` or still tagged
        stands on them (only its own top layer: those below it may be another snapshot's)."""
        assert self._builder is not None
        kept = {layer.id for t in [*in_use(), *self._catalog.tagged()] for layer in t.layers if _is_snapshot(layer)}
        for build in builds:
            own = build.template.layers[-1] if build.template else None
            # A memory image is its snapshot's alone: a sandbox restored from it no longer needs it.
            memory = build.template is not None and build.template.memory_image
            if build.template is not None and (memory or (isinstance(own, SnapshotLayer) and own.id not in kept)):
                try:
                    await self._builder.drop_snapshot_files(build.template)
                except (OSError, PoolError) as exc:  # what refers to them is gone all the same; the files stay
                    _log.warning("the files of snapshot %s stay: %s", build.template.name, exc)

    def template(self, owner: str, reference: str) -> TemplateRecord:
        """`owner`'s template by name or ID; BuildNotFound when it has none."""
        record = self._catalog.find_built(owner, reference)
        if record is None:
            raise BuildNotFound(f"template '{reference}' not found")
        return record

    def build(self, owner: str, template_id: str, build_id: str) -> BuildRecord:
        """The build with its log so far; BuildNotFound when it is not one of `owner`'s."""
        self.template(owner, template_id)
        build = self._builds.get(build_id)
        if build is None or build.template_id != template_id:
            raise BuildNotFound(f"build '{build_id}' of template '{template_id}' not found")
        running = self._running.get(build_id)
        return build if running is None else msgspec.structs.replace(build, logs=tuple(running))

    def builds_of(self, owner: str, template_id: str) -> list[BuildRecord]:
        """The template's builds, newest first, each with its log so far."""
        ids = [b.build_id for b in self._builds.values() if b.template_id == template_id]
        builds = [self.build(owner, template_id, build_id) for build_id in ids]
        return sorted(builds, key=lambda b: b.created_at, reverse=True)

    def latest(self, template_id: str) -> BuildRecord | None:
        """The template's newest build (None before its first)."""
        builds = [b for b in self._builds.values() if b.template_id == template_id]
        return max(builds, key=lambda b: b.created_at) if builds else None

    async def start(self, owner: str, template_id: str, build_id: str, plan: Callable[[], BuildPlan]) -> None:
        """Run the waiting build: `plan()` gives its template, each layer's step label and notes for the log
        (raising BuildFailure fails the build at that step instead). InvalidRequest when the build is not waiting."""
        self._ready()
        build = self.build(owner, template_id, build_id)
        if build.status != "waiting":
            raise InvalidRequest(f"build '{build_id}' is {build.status}: only a waiting build can be started")
        self._running[build_id] = []
        self._builds[build_id] = build = msgspec.structs.replace(build, status="building")
        task = asyncio.create_task(self._run(owner, build, plan))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def delete(self, owner: str, reference: str, in_use: InUse) -> None:
        """Delete `owner`'s template and its builds; BuildNotFound if none. Running sandboxes and layers stay, but
        a snapshot's own files (the one copy of them) go unless a template `in_use()` or still tagged names them."""
        record = self.template(owner, reference)
        builds = [b for b in self._builds.values() if b.template_id == record.template_id]
        keys = {build_key(record.template_id, build.build_id) for build in builds}
        if keys & {template.name for template in in_use()}:
            await self._ready().put_template(msgspec.structs.replace(record, tags={}, deleted=True))
            self._deleted[record.template_id] = builds
        else:
            await self._ready().delete_template(record.template_id)
        self._catalog.remove_built(record.template_id)
        await self._sync_pools(msgspec.structs.replace(record, tags={}))
        if record.snapshot_of:
            await self._drop_files(builds, in_use)

    async def assign_tags(self, owner: str, target: str, tags: list[str]) -> str:
        """Point `tags` at the build `target` (`name:tag`) names; the build id."""
        name, _, tag = target.rpartition("/")[2].partition(":")
        record = self.template(owner, name)
        build_id = record.tags.get(tag or DEFAULT_TAG)
        if build_id is None:
            raise BuildNotFound(f"template '{target}' not found")
        await self._retag(record, {**record.tags, **dict.fromkeys(tags, build_id)})
        return build_id

    async def remove_tags(self, owner: str, name: str, tags: list[str]) -> None:
        record = self.template(owner, name)
        await self._retag(record, {tag: build for tag, build in record.tags.items() if tag not in tags})

    # the run

    async def _run(self, owner: str, build: BuildRecord, plan: Callable[[], BuildPlan]) -> None:
        log = self._running[build.build_id]
        status: Literal["ready", "error"] = "error"
        template: Template | None = None
        failure: BuildFailure | None = None
        try:
            planned = plan()
            log.extend(_entry(self._clock(), "info", note, "base") for note in planned.notes)
            named = msgspec.structs.replace(planned.template, name=build_key(build.template_id, build.build_id))
            template = await self._build(owner, named, planned.labels, log, planned.registry)
            status = "ready"
        except BuildFailure as exc:
            failure = exc
        except asyncio.CancelledError:
            failure = BuildFailure("the server stopped during the build", "finalize")
            raise
        except Exception as exc:  # a bug must fail the build, not leave it "building" for ever
            _log.exception("template build %s failed", build.build_id)
            failure = BuildFailure(f"the build failed: {exc!r}", "finalize")
        finally:
            await self._finish(owner, build, status, template, failure, log)

    async def _build(
        self,
        owner: str,
        template: Template,
        labels: tuple[str, ...],
        log: list[BuildLogEntry],
        registry: RegistryLogin | None = None,
    ) -> Template:
        """The template as built; BuildFailure naming the failed step."""
        assert self._builder is not None

        def record(layer: int | None, level: str, message: str) -> None:
            step = labels[layer] if layer is not None and 0 <= layer < len(labels) else "finalize"
            if len(log) < MAX_LOG_ENTRIES:
                log.append(_entry(self._clock(), _level(level), message, step))

        if self._slots.locked():
            record(None, "info", "waiting for another build to finish")
        async with self._slots:
            try:
                files = self.files
                assert files is not None
                return await self._builder.build_template(
                    template, record, files=lambda files_hash: files.path(owner, files_hash),
                    within=self._build_timeout, registry=registry,
                )  # fmt: skip
            except TemplateBuildFailed as exc:
                step = labels[exc.layer] if exc.layer is not None and exc.layer < len(labels) else "finalize"
                raise BuildFailure(str(exc), step) from exc
            except PoolError as exc:
                raise BuildFailure(f"the build failed: {exc}", "finalize") from exc

    async def _finish(
        self,
        owner: str,
        build: BuildRecord,
        status: Literal["ready", "error"],
        template: Template | None,
        failure: BuildFailure | None,
        log: list[BuildLogEntry],
    ) -> None:
        now = self._clock()
        if failure is not None:
            log.append(_entry(now, "error", failure.message, failure.step))
        else:
            log.append(_entry(now, "info", "build finished", "finalize"))
        done = msgspec.structs.replace(
            build, status=status, finished_at=now, template=template if status == "ready" else None,
            reason=failure.message if failure else "", reason_step=failure.step if failure else None, logs=tuple(log),
        )  # fmt: skip
        self._builds[build.build_id] = done
        self._running.pop(build.build_id, None)
        tags = self._pending_tags.pop(build.build_id, [DEFAULT_TAG])
        ledger = self._ready()
        await ledger.put_build(done)
        record = self._catalog.find_built(owner, build.template_id)
        if record is not None and status == "ready":
            record = msgspec.structs.replace(record, tags={**record.tags, **dict.fromkeys(tags, build.build_id)},
                                             updated_at=now)  # fmt: skip
            await ledger.put_template(record)
            self._catalog.put_built(record, [done])
            await self._sync_pools(record)

    async def _retag(self, record: TemplateRecord, tags: dict[str, str]) -> None:
        record = msgspec.structs.replace(record, tags=tags, updated_at=self._clock())
        await self._ready().put_template(record)
        self._catalog.put_built(record, [b for b in self._builds.values() if b.template_id == record.template_id])
        await self._sync_pools(record)

    async def _sync_pools(self, record: TemplateRecord) -> None:
        """Give the builds the template's tags name a warm pool, and take it from those they no longer name."""
        if self._warm is None:
            return
        wanted = {build_key(record.template_id, build_id) for build_id in record.tags.values()}
        wanted &= set(self._catalog.templates)
        had = self._pooled.get(record.template_id, set())
        for name in sorted(wanted - had):
            self._warm.add(self._catalog.templates[name], self._warm_target)
        for name in sorted(had - wanted):
            await self._warm.remove(name)
        self._pooled[record.template_id] = wanted

    def _ready(self) -> TemplateLedger:
        if self.refusal:
            raise NotSupported(self.refusal)
        assert self._ledger is not None
        return self._ledger


def _is_snapshot(layer: Layer) -> TypeGuard[SnapshotLayer]:
    return isinstance(layer, SnapshotLayer)


def _template_id() -> str:
    """An id like E2B's: 20 lowercase letters and digits."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(20))


def _entry(at: float, level: LogLevel, message: str, step: str | None = None) -> BuildLogEntry:
    return BuildLogEntry(timestamp=at, level=level, message=message, step=step)


def _level(level: str) -> LogLevel:
    """A runtime's log level as a build log's: an unknown one is "info"."""
    return next((known for known in LOG_LEVELS if known == level), "info")
