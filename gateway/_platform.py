"""Everything `serve` runs, opened in order and closed in reverse: store, runtime, activator, background loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import msgspec

from activator import Activator, ActivatorSettings, ApiKeys, Store
from gateway._http_proxy import UpstreamConnection
from gateway._settings import ServeSettings
from gateway._upstream import UpstreamPool
from pool import LocalRuntime, LocalRuntimeSettings, Template, load_templates

__all__ = ["Platform", "open_platform"]

_log = logging.getLogger("agent-sandbox")


class Platform(msgspec.Struct, frozen=True, kw_only=True):
    """The running parts the app is assembled from."""

    settings: ServeSettings
    templates: dict[str, Template]
    store: Store
    keys: ApiKeys
    runtime: LocalRuntime
    activator: Activator
    upstreams: UpstreamPool[UpstreamConnection]


async def _build_missing_images(runtime: LocalRuntime, templates: dict[str, Template]) -> None:
    for template in templates.values():
        if not runtime.images.is_built(template):
            _log.info("building the layers of template %r (once; later starts reuse them)", template.name)
            await asyncio.to_thread(runtime.images.build, template, _log.info)


@asynccontextmanager
async def open_platform(settings: ServeSettings) -> AsyncIterator[Platform]:
    async with AsyncExitStack() as stack:
        templates = load_templates(settings.templates)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = await Store.open(settings.data_dir / "state.db")
        stack.push_async_callback(store.close)
        runtime = LocalRuntime(
            LocalRuntimeSettings(
                data_dir=settings.data_dir, image_cache=settings.image_cache, executor_source=settings.executor_source
            ),
            parent_cgroup=settings.cgroup_name,
        )
        stack.callback(runtime.close)
        await _build_missing_images(runtime, templates)
        upstreams: UpstreamPool[UpstreamConnection] = UpstreamPool()
        stack.callback(upstreams.close)
        activator = Activator(
            store, runtime, templates, ActivatorSettings(domain=settings.domain), on_halt=upstreams.drop
        )
        runtime.set_exit_listener(activator.sandbox_exited)
        await activator.recover()
        reaper = asyncio.create_task(activator.run_reaper())
        stack.push_async_callback(_cancel, reaper)
        yield Platform(
            settings=settings, templates=templates, store=store, keys=ApiKeys(store), runtime=runtime,
            activator=activator, upstreams=upstreams,
        )  # fmt: skip


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
