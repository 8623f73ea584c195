"""The control plane against the real `e2b` SDK (sync API), served by uvicorn over the fake runtime."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from tests.test_e2b_api_server import ControlPlane, serve_control_plane


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with serve_control_plane(tmp_path_factory.mktemp("plane")) as plane:
        yield plane


@pytest.fixture(autouse=True)
def _no_e2b_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's E2B settings must not leak in: every call below names its server and key."""
    for name in ("E2B_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def opts(plane: ControlPlane, key: str | None = None) -> dict[str, Any]:
    return {"api_key": key or plane.key, "api_url": plane.url, "sandbox_url": plane.url}


def test_create_passes_envs_and_token_to_the_runtime(plane: ControlPlane) -> None:
    sandbox = Sandbox.create("base", timeout=120, metadata={"owner": "alice"}, envs={"FOO": "bar"}, **opts(plane))
    spec = plane.runtime.specs[sandbox.sandbox_id]
    assert spec.init.env_vars == {"FOO": "bar"}
    assert spec.init.access_token == sandbox._envd_access_token is not None
    assert (spec.init.default_user, spec.init.default_workdir) == ("user", "/home/user")
    info = sandbox.get_info()
    assert (info.template_id, info.name, info.metadata, info.state) == ("base", "base", {"owner": "alice"}, "running")
    assert (info.end_at - info.started_at).total_seconds() == pytest.approx(120)


def test_set_timeout_moves_the_deadline(plane: ControlPlane) -> None:
    sandbox = Sandbox.create("base", timeout=60, **opts(plane))
    before = sandbox.get_info().end_at
    sandbox.set_timeout(600)
    assert (sandbox.get_info().end_at - before).total_seconds() > 500


def test_list_filters_by_metadata_and_state_across_pages(plane: ControlPlane) -> None:
    tag = {"suite": "listing", "k y": "v&w=1"}
    wanted = [Sandbox.create("base", metadata=tag, **opts(plane)).sandbox_id for _ in range(3)]
    Sandbox.create("base", metadata={"suite": "other"}, **opts(plane))
    paused = Sandbox.create("base", metadata=tag, **opts(plane))
    paused.pause()
    query = SandboxQuery(metadata=tag, state=[SandboxState.RUNNING])
    paginator = Sandbox.list(query=query, limit=2, **opts(plane))
    first = paginator.next_items()
    more_after_first = paginator.has_next
    second = paginator.next_items()
    assert (more_after_first, paginator.has_next) == (True, False)
    assert [s.sandbox_id for s in first + second] == wanted[::-1]
    paused_only = Sandbox.list(query=SandboxQuery(metadata=tag, state=[SandboxState.PAUSED]), **opts(plane))
    assert [s.sandbox_id for s in paused_only.next_items()] == [paused.sandbox_id]


def test_kill_twice_returns_false_the_second_time(plane: ControlPlane) -> None:
    sandbox = Sandbox.create("base", **opts(plane))
    assert sandbox.kill()
    assert not sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()


def test_pause_twice_then_connect_resumes(plane: ControlPlane) -> None:
    sandbox = Sandbox.create("base", **opts(plane))
    before = sandbox.get_metrics()
    assert sandbox.pause()
    assert not sandbox.pause()
    assert sandbox.sandbox_id in plane.runtime.snapshots
    assert sandbox.get_info().state == "paused"
    assert sandbox.get_metrics() == before  # its history, and nothing new to measure while scaled to zero
    resumed = Sandbox.connect(sandbox.sandbox_id, timeout=300, **opts(plane))
    assert resumed.get_info().state == "running"
    assert sandbox.sandbox_id in plane.runtime.running


def test_metrics_report_the_runtime_stats(plane: ControlPlane) -> None:
    sandbox = Sandbox.create("base", **opts(plane))
    [sample] = sandbox.get_metrics()
    assert (sample.cpu_count, sample.cpu_used_pct, sample.mem_total) == (1, 12.5, 1 << 30)


def test_wrong_key_is_an_authentication_error(plane: ControlPlane) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create("base", **opts(plane, "e2b_" + "0" * 32))


def test_other_keys_sandbox_is_not_found(plane: ControlPlane) -> None:
    sandbox = Sandbox.create("base", **opts(plane))
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, **opts(plane, plane.other_key))
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, **opts(plane, plane.other_key))
    assert not Sandbox.kill(sandbox.sandbox_id, **opts(plane, plane.other_key))
    assert sandbox.get_info().state == "running"


def test_unknown_template_is_refused(plane: ControlPlane) -> None:
    with pytest.raises(SandboxException, match="template 'nope' not found"):
        Sandbox.create("nope", **opts(plane))
