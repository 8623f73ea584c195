"""`agent-sandbox templates build` (also `images build`): build the built-in templates' layers ahead of time.

Layers built on the host (debootstrap, apt, pip) need only the image cache; a template with `run`, `npm` or
`copy` layers is built by the local runtime, in build sandboxes under `--data-dir`, then started once.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gateway import ServeSettings
from pool import (
    ImageBuildError,
    ImageStore,
    LocalRuntime,
    LocalRuntimeSettings,
    PoolError,
    Template,
    TemplateError,
    load_templates,
)
from pool import has_sandboxed_layers as sandboxed

__all__ = ["build_images"]


def build_images(templates_dir: Path, cache: Path, names: list[str], *, data_dir: Path, refresh: bool = False) -> None:
    """`refresh`: build every layer of the chosen templates again, under new keys, against today's archives and
    registries (security updates); servers use them for new sandboxes once all are built, and sandboxes already
    made keep the layers they were pinned to."""
    try:
        templates = load_templates(templates_dir)
    except TemplateError as exc:
        sys.exit(f"agent-sandbox: {exc}")
    unknown = sorted(set(names) - templates.keys())
    if unknown:
        sys.exit(f"agent-sandbox: unknown templates: {', '.join(unknown)} (known: {', '.join(sorted(templates))})")
    chosen = [templates[name] for name in names or sorted(templates)]
    settings = ServeSettings(data_dir=data_dir, image_cache=cache)
    current = ImageStore(cache, settings.executor_source)
    refreshed = {t.name: current.generation(t.name) + 1 for t in chosen} if refresh else {}
    store = ImageStore(cache, settings.executor_source, refreshed=refreshed)
    try:
        for template in chosen:
            if not sandboxed(template):
                store.build(template, log=_print)
        # Those already built are not started again (a build ends with a trial start).
        in_sandboxes = [template for template in chosen if sandboxed(template) and not store.is_built(template)]
        if in_sandboxes:
            asyncio.run(_build_in_sandboxes(settings, in_sandboxes, refreshed))
    except (ImageBuildError, PoolError) as exc:
        sys.exit(f"agent-sandbox: {exc}")
    if refreshed:
        store.record_refresh(refreshed)
        _print(f"refreshed: {', '.join(f'{name} (generation {n})' for name, n in sorted(refreshed.items()))}")


async def _build_in_sandboxes(settings: ServeSettings, templates: list[Template], refreshed: dict[str, int]) -> None:
    runtime = LocalRuntime(
        LocalRuntimeSettings(data_dir=settings.data_dir, image_cache=settings.image_cache,
                             executor_source=settings.executor_source, refreshed=refreshed),
        parent_cgroup=settings.cgroup_name,
    )  # fmt: skip
    try:
        for template in templates:
            await runtime.build_builtin(template, _print)
    finally:
        runtime.close()


def _print(line: str) -> None:
    print(f"agent-sandbox: {line}", flush=True)
