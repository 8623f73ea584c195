"""A real local runtime on a temporary data directory, for tests of the runtime itself."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from gateway._settings import DEFAULT_TEMPLATES, ServeSettings
from pool import ExecutorInit, LocalRuntime, LocalRuntimeSettings, SandboxSpec, Template, load_templates

__all__ = ["IMAGE_CACHE", "TEMPLATES", "local_runtime", "spec"]

IMAGE_CACHE = Path(os.environ.get("AGENT_SANDBOX_IMAGE_CACHE", "/var/cache/agent-sandbox/images"))
TEMPLATES = load_templates(DEFAULT_TEMPLATES)


def spec(sandbox_id: str, template: Template | None = None) -> SandboxSpec:
    return SandboxSpec(sandbox_id=sandbox_id, template=template or TEMPLATES["base"], init=ExecutorInit())


@asynccontextmanager
async def local_runtime(data_dir: Path) -> AsyncIterator[LocalRuntime]:
    """A runtime whose sandboxes are all stopped when the block ends."""
    settings = LocalRuntimeSettings(
        data_dir=data_dir, image_cache=IMAGE_CACHE, executor_source=ServeSettings().executor_source
    )
    runtime = LocalRuntime(settings, parent_cgroup="agent-sandbox-test-" + data_dir.name[-12:])
    await asyncio.to_thread(runtime.images.build, TEMPLATES["base"], lambda _line: None)  # no-op when built
    try:
        yield runtime
    finally:
        for sandbox_id in list(runtime.sandbox_ids()):
            await runtime.stop(sandbox_id)
        runtime.close()
