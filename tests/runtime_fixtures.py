"""A real local runtime on a temporary data directory, for tests of the runtime itself."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import msgspec
import pytest

from gateway._settings import DEFAULT_TEMPLATES, ServeSettings
from pool import EgressSettings, ExecutorInit, LocalRuntime, LocalRuntimeSettings, SandboxSpec, Template, load_templates
from pool._local._criu import criu_dir, probe

__all__ = [
    "IMAGE_CACHE",
    "TEMPLATES",
    "base_with",
    "http_get",
    "local_runtime",
    "new_runtime",
    "require_criu",
    "runtime_cgroup",
    "runtime_settings",
    "sandbox_footprint",
    "spec",
]  # fmt: skip

IMAGE_CACHE = Path(os.environ.get("AGENT_SANDBOX_IMAGE_CACHE", "/var/cache/agent-sandbox/images"))
TEMPLATES = load_templates(DEFAULT_TEMPLATES)


def base_with(**resources: int) -> Template:
    """The `base` template with some of its resources changed (`disk_mb=64`, `memory_mb=256`, ...)."""
    base = TEMPLATES["base"]
    return msgspec.structs.replace(base, resources=msgspec.structs.replace(base.resources, **resources))


def spec(sandbox_id: str, template: Template | None = None, *, access_token: str | None = None) -> SandboxSpec:
    init = ExecutorInit(access_token=access_token)
    return SandboxSpec(sandbox_id=sandbox_id, template=template or TEMPLATES["base"], init=init)


def runtime_settings(
    data_dir: Path, *, criu: bool = True, ports_timeout: float = 30.0, egress: EgressSettings | None = None
) -> LocalRuntimeSettings:
    """Settings for a test runtime; `criu=False` forces files-only snapshots; `egress` e.g. names the test DNS."""
    return LocalRuntimeSettings(
        data_dir=data_dir, image_cache=IMAGE_CACHE, executor_source=ServeSettings().executor_source,
        criu_dir=criu_dir() if criu else None, ports_timeout=ports_timeout, egress=egress or EgressSettings(),
    )  # fmt: skip


def runtime_cgroup(data_dir: Path) -> str:
    """The parent cgroup of a test runtime's sandboxes: one per data directory, apart from any server's."""
    return "agent-sandbox-test-" + data_dir.name[-12:]


def new_runtime(settings: LocalRuntimeSettings) -> LocalRuntime:
    """A runtime on `settings`; a second one on the same data directory stands for a restarted server."""
    return LocalRuntime(settings, parent_cgroup=runtime_cgroup(settings.data_dir))


@asynccontextmanager
async def local_runtime(
    data_dir: Path, *, criu: bool = True, ports_timeout: float = 30.0, egress: EgressSettings | None = None
) -> AsyncIterator[LocalRuntime]:
    """A runtime whose sandboxes, running or snapshotted, are all stopped when the block ends."""
    runtime = new_runtime(runtime_settings(data_dir, criu=criu, ports_timeout=ports_timeout, egress=egress))
    await asyncio.to_thread(runtime.images.build, TEMPLATES["base"], lambda _line: None)  # no-op when built
    try:
        yield runtime
    finally:
        for sandbox_id in [*runtime.sandbox_ids(), *runtime.snapshotted_ids()]:
            await runtime.stop(sandbox_id)
        await runtime.criu_trial()  # its thread must not run on into the next test (a unit test forbids criu)
        runtime.close()


def require_criu() -> None:
    """Skip when CRIU does not work here, except under CI=true, where that fails: CI must prove snapshots."""
    status = probe(criu_dir())
    if not status.available:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CRIU must work in CI (run scripts/build-criu): {status.reason}")
        pytest.skip(f"CRIU is not available here (run scripts/build-criu as root): {status.reason}")


async def http_get(runtime: LocalRuntime, sandbox_id: str, port: int, path: str = "/") -> bytes:
    """GET `path` from a server inside the sandbox; returns the body of a 200 (asserted)."""
    reader, writer = await asyncio.open_connection(sock=await runtime.open_socket(sandbox_id, port))
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    assert response.startswith(b"HTTP/1.0 200"), response[:300]
    return response.split(b"\r\n\r\n", 1)[1]


def sandbox_footprint(data_dir: Path, sandbox_id: str) -> tuple[list[int], list[Path]]:
    """Host processes in the sandbox's uid range, and its cgroup directories: both empty when scaled to zero."""
    slot = int((data_dir / "sandboxes" / sandbox_id / "slot").read_text())
    base = 100000 + slot * 65536
    processes = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if base <= os.stat(f"/proc/{entry}").st_uid < base + 65536:
                processes.append(int(entry))
        except OSError:
            continue
    root = Path("/sys/fs/cgroup")
    patterns = (f"*/agent-sandbox-test-*/{sandbox_id}", f"agent-sandbox-test-*/{sandbox_id}")  # v1 or hybrid, v2
    cgroups = [p for pattern in patterns for p in root.glob(pattern) if p.is_dir()]
    return processes, cgroups
