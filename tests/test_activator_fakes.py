"""Test doubles for the activator's unit tests: an in-memory runtime, a hand-driven clock, a template.

(Bind the fixtures in a test module with `store = fakes.store`: pytest finds fixtures by module names.)
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from activator import Activator, ActivatorSettings, CreateRequest, SqliteStore, Store
from activator._machine import SandboxWatcher
from pool import (
    CheckpointFailed,
    EgressRules,
    Forker,
    PortClosed,
    Resources,
    RuntimeCapabilities,
    RuntimeFailure,
    SandboxGone,
    SandboxSpec,
    SandboxStats,
    SnapshotInfo,
    SnapshotKind,
    Template,
)


class FakeRuntime:
    """An in-memory `Runtime`: remembers which sandboxes run, are frozen or snapshotted, and what it was asked."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.frozen: set[str] = set()
        self.snapshots: dict[str, SnapshotKind] = {}
        self.crashed: dict[str, str] = {}  # what `crashes` reports: found dead by `recover`, among `snapshots`
        self.specs: dict[str, SandboxSpec] = {}
        self.noted: dict[str, SandboxSpec] = {}  # what `note_spec` was told
        self.calls: list[tuple[str, str]] = []
        self.fail: set[str] = set()  # method names that raise RuntimeFailure
        self.dump_fails = False  # `snapshot` with memory raises CheckpointFailed, the sandbox left running
        self.listening: set[int] = set()  # ports open_socket connects to
        self.kind: SnapshotKind = "criu"  # what `snapshot` keeps
        self.keeps_processes = True  # what `snapshot_keeps_processes` answers
        self.restored: dict[str, SnapshotKind] = {}  # what the last restore of each sandbox brought back
        self.egress: dict[str, EgressRules] = {}  # what `set_egress` was told last
        self.domain_refusal = ""  # what `capabilities` says of allowOut domains

    async def start(self, spec: SandboxSpec) -> None:
        self._call("start", spec.sandbox_id)
        self.specs[spec.sandbox_id] = spec
        self.running.add(spec.sandbox_id)

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        self._call("stop", sandbox_id)
        self.running.discard(sandbox_id)
        self.frozen.discard(sandbox_id)
        self.snapshots.pop(sandbox_id, None)

    def note_spec(self, spec: SandboxSpec) -> None:
        self.noted[spec.sandbox_id] = spec

    def snapshot_keeps_processes(self, sandbox_id: str) -> bool:
        self._call("snapshot_keeps_processes", sandbox_id)
        return self.keeps_processes

    async def snapshot(self, sandbox_id: str, *, memory: bool = True) -> SnapshotInfo:
        self._call("snapshot", sandbox_id)
        if self.dump_fails and memory and sandbox_id in self.running:
            raise CheckpointFailed(f"sandbox {sandbox_id}: its memory could not be snapshotted")
        if sandbox_id not in self.snapshots:
            if sandbox_id not in self.running:
                raise SandboxGone(sandbox_id)
            self.running.discard(sandbox_id)
            self.frozen.discard(sandbox_id)
            self.snapshots[sandbox_id] = self.kind if memory else "filesystem"
        return SnapshotInfo(kind=self.snapshots[sandbox_id], seconds=0.1, image_bytes=1 << 20)

    async def restore(self, spec: SandboxSpec, *, memory: bool = True) -> None:
        self._call("restore", spec.sandbox_id)
        if spec.sandbox_id in self.running:
            return
        kind = self.snapshots.pop(spec.sandbox_id, None)
        if kind is None:
            raise SandboxGone(spec.sandbox_id)
        self.restored[spec.sandbox_id] = kind if memory else "filesystem"
        self.specs[spec.sandbox_id] = spec
        self.running.add(spec.sandbox_id)

    def is_snapshotted(self, sandbox_id: str) -> bool:
        return sandbox_id in self.snapshots

    def snapshotted_ids(self) -> set[str]:
        return set(self.snapshots)

    def crashes(self) -> dict[str, str]:
        return dict(self.crashed)

    async def freeze(self, sandbox_id: str) -> None:
        self._call("freeze", sandbox_id)
        self.frozen.add(sandbox_id)

    async def thaw(self, sandbox_id: str) -> None:
        self._call("thaw", sandbox_id)
        self.frozen.discard(sandbox_id)

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket:
        self._call("open_socket", sandbox_id)
        if sandbox_id not in self.running:
            raise SandboxGone(f"{sandbox_id} has no processes")
        if port not in self.listening or sandbox_id in self.frozen:
            raise PortClosed(f"nothing listens on {port}")
        return socket.socket()

    async def set_egress(self, sandbox_id: str, rules: EgressRules) -> None:
        self._call("set_egress", sandbox_id)
        self.egress[sandbox_id] = rules

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(snapshot_kind=self.kind, domain_refusal=self.domain_refusal)

    def is_running(self, sandbox_id: str) -> bool:
        return sandbox_id in self.running

    async def stats(self, sandbox_id: str) -> SandboxStats:
        self._call("stats", sandbox_id)
        return SandboxStats(
            cpu_count=1, cpu_used_pct=12.5, cpu_seconds=3.0, mem_used=1 << 20, mem_total=1 << 30, mem_cache=0,
            disk_used=1 << 10, disk_total=1 << 32,
        )  # fmt: skip

    async def recover(self) -> set[str]:
        return set(self.running)

    def _call(self, method: str, sandbox_id: str) -> None:
        self.calls.append((method, sandbox_id))
        if method in self.fail:
            raise RuntimeFailure(f"{method} failed")


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def template(name: str = "base", *, pause_after: float | None = None, snapshot_after: float | None = None) -> Template:
    """A resolved template as `load_templates` would make it."""
    return Template(
        name=name,
        description=f"the {name} template",
        layers=(),
        env={},
        start=(),
        ports=(),
        user="user",
        workdir="/home/user",
        resources=Resources(cpu_count=2, memory_mb=1024, disk_mb=4096),
        warm=0,
        pause_after=pause_after,
        snapshot_after=snapshot_after,
    )


def activator(
    store: Store,
    runtime: FakeRuntime,
    clock: Clock,
    *templates: Template,
    on_halt: Callable[[str], None] | None = None,
    forker: Forker | None = None,
    watcher: SandboxWatcher | None = None,
    **settings: Any,
) -> Activator:
    """An `Activator` over `runtime` with the `base` template (or `templates`) and `settings`."""
    known = {t.name: t for t in templates or (template(),)}
    parsed = msgspec.convert(settings, ActivatorSettings)
    return Activator(store, runtime, known, parsed, clock=clock, on_halt=on_halt, forker=forker, watcher=watcher)


def request(**changes: Any) -> CreateRequest:
    """A create request for the `base` template with a 300 s timeout."""
    return msgspec.structs.replace(CreateRequest(template="base", timeout=300.0), **changes)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh SQLite store in the test's temporary directory."""
    store = await SqliteStore.open(tmp_path / "state.sqlite")
    yield store
    await store.close()


@pytest.fixture
def runtime() -> FakeRuntime:
    """A fake runtime whose sandboxes listen on port 8080."""
    runtime = FakeRuntime()
    runtime.listening.add(8080)
    return runtime


@pytest.fixture
def clock() -> Clock:
    return Clock()
