"""Shared fixtures (one real `agent-sandbox serve` per session, the E2B SDK pointed at it) and the suite's tiers.

Every test is marked with the tiers of the real components it uses, derived here from what it reaches: the
fixtures it requests and the starters (`running_server`, `local_runtime`, `run_executor`, `require_criu`...) that
its code, its fixtures' code or the test helpers they call refer to. A test that reaches none is `unit`; a test
marks itself what the derivation cannot see. `scripts/test --fast` runs only the unit tier, so a unit test that
starts a component's program (a sandbox, a server, CRIU, Redis, the cluster) fails and says so; short-lived tools
(a schema validator, a code interpreter's kernel) may run.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

from cli._doctor import doctor
from pool import ImageStore
from pool._local._criu import probe
from tests import (
    executor_fixtures,
    kube_fixtures,
    real_node_fixtures,
    redis_fixtures,
    runtime_fixtures,
    scale_to_zero_fixtures,
)
from tests.server_fixtures import RunningServer, point_e2b_at, running_server, server_in_temp_dir

TIERS = ("unit", "sandbox", "criu", "kube", "realnode", "redis", "browser")

# The fixtures and starters that stand for a real component, and the tiers each one brings.
_FIXTURE_TIERS = {
    "server": {"sandbox"}, "kube": {"kube"}, "real_node": {"kube", "realnode"}, "redis_server": {"redis"},
    "browser": {"browser"},
}  # fmt: skip
_STARTER_TIERS: dict[int, set[str]] = {
    id(running_server): {"sandbox"},
    id(runtime_fixtures.local_runtime): {"sandbox"},
    id(runtime_fixtures.new_runtime): {"sandbox"},
    id(executor_fixtures.run_executor): {"sandbox"},
    id(runtime_fixtures.require_criu): {"sandbox", "criu"},
    id(scale_to_zero_fixtures.criu_or_skip): {"sandbox", "criu"},
    id(kube_fixtures.require_binaries): {"kube"},
    id(real_node_fixtures.require_real_node): {"kube", "realnode"},
    id(redis_fixtures.require_redis_server): {"redis"},
    id(doctor): {"sandbox"},  # it starts a trial sandbox
    id(ImageStore): {"sandbox"},  # it builds sandbox images
    id(probe): {"criu"},  # it runs CRIU
}
# The programs of real components, which a unit test must not start (nor `serve`, nor the executor's server).
_COMPONENTS = {
    "bwrap", "criu", "redis-server", "kube-dev-cluster", "etcd", "kube-apiserver", "kubelet", "containerd", "chromium",
}  # fmt: skip
_PROCESS_EVENTS = {"subprocess.Popen": 1, "os.posix_spawn": 1, "os.exec": 1, "os.system": 0}  # -> where argv is


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_no_process_in_unit_tests)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        tiers = _derived_tiers(item) | {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        for tier in sorted(tiers or {"unit"}):
            item.add_marker(tier)


def _derived_tiers(item: pytest.Function) -> set[str]:
    tiers = set().union(*(_FIXTURE_TIERS.get(name, set()) for name in item.fixturenames))
    roots = [item.function, *(d.func for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs)]
    seen: set[int] = set()
    for root in roots:
        for reached in _reached(root, seen):
            tiers |= _STARTER_TIERS.get(id(reached), set())
    return tiers


def _reached(obj: Any, seen: set[int]) -> Iterator[Any]:
    """`obj`, and what the code of the test helpers it refers to (by global name, or as `module.name`) reaches."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if inspect.isclass(obj) and obj.__module__.startswith("tests."):
        for member in vars(obj).values():
            yield from _reached(getattr(member, "fget", getattr(member, "__func__", member)), seen)
    function = inspect.unwrap(obj) if callable(obj) else None
    if not inspect.isfunction(function) or not function.__module__.startswith("tests"):
        return
    namespace = function.__globals__
    modules = [m for m in namespace.values() if isinstance(m, types.ModuleType) and m.__name__.startswith("tests.")]
    for name in _names(function.__code__):
        for found in (namespace.get(name), *(getattr(m, name, None) for m in modules)):
            if found is not None:
                yield from _reached(found, seen)


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


# The test being set up or run. Not while torn down: the last test tears down the session's servers too.
_current: list[pytest.Item] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    _current.append(item)
    try:
        return (yield)
    finally:
        _current.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    _current.append(item)
    try:
        return (yield)
    finally:
        _current.pop()


def _no_process_in_unit_tests(
    event: str,
    args: tuple[Any, ...],
    _events: dict[str, int] = _PROCESS_EVENTS,  # bound: globals are None at exit
) -> None:
    if event in _events and _current and _current[-1].get_closest_marker("unit"):
        argv = args[_events[event]]
        words = [os.path.basename(os.fsdecode(word)) for word in (argv.split() if isinstance(argv, str) else argv)]
        if _COMPONENTS & set(words) or words[1:3] == ["-m", "executor"] or ("serve" in words and "--help" not in words):
            raise RuntimeError(
                f"a unit test started a component ({' '.join(words)}): mark its tier (tests/conftest.py)"
            )


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with server_in_temp_dir(tmp_path_factory, "server") as running:
        yield running


@pytest.fixture
def e2b_env(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> RunningServer:
    """Point the E2B SDK at the session's server (plain-HTTP single-host recipe)."""
    return point_e2b_at(server, monkeypatch)


@pytest.fixture
def sbx(e2b_env: RunningServer) -> Iterator[Sandbox]:
    """One E2B SDK sandbox of the session's server (template `base`), killed when the test ends."""
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


@pytest.fixture
def sandboxes(e2b_env: RunningServer) -> Iterator[list[Sandbox]]:
    """E2B SDK sandboxes a test creates (it appends them), killed when it ends."""
    made: list[Sandbox] = []
    yield made
    for sandbox in made:
        sandbox.kill()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
