"""`agent-sandbox serve` as a new user meets it: first start, health, the API key, auth, and SIGTERM."""

from __future__ import annotations

import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import ServeSettings
from gateway._platform import _agent_mirror, _make_private_dir
from tests.server_fixtures import REPO, running_server


def test_first_start_creates_prints_and_saves_one_key(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_server(data_dir) as server:
        key_file = data_dir / "api-key"
        assert re.fullmatch(r"e2b_[0-9a-f]{32}\n", key_file.read_text())
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        log = (tmp_path / "data.server.log").read_text()
        assert log.count(server.api_key) == 1
        assert server.api_key not in (data_dir / "state.db").read_bytes().decode(errors="replace")
    with running_server(data_dir) as again:
        assert again.api_key == server.api_key
        assert "created API key" not in (tmp_path / "data.server.log").read_text()


def test_health_answers_without_a_key_and_the_api_refuses_without_one(tmp_path: Path) -> None:
    with running_server(tmp_path / "data") as server:
        assert httpx.get(f"{server.url}/health").status_code == 200
        for headers in ({}, {"X-API-Key": "e2b_" + "0" * 32}, {"X-API-Key": "not-a-key"}):
            refused = httpx.get(f"{server.url}/v2/sandboxes", headers=headers)
            assert refused.status_code == 401
            assert refused.json()["code"] == 401
            assert refused.json()["message"]
        allowed = httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-Key": server.api_key})
        assert allowed.status_code == 200


def test_explicit_api_key_from_the_environment_is_the_key(tmp_path: Path) -> None:
    key = "e2b_" + "ab" * 16
    with running_server(tmp_path / "data", env={"AGENT_SANDBOX_API_KEY": key}) as server:
        assert server.api_key == key
        assert httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-Key": key}).status_code == 200
        assert not (tmp_path / "data" / "api-key").exists()


@pytest.mark.sandbox  # a real `serve` process
def test_malformed_explicit_key_is_refused_at_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--data-dir", str(tmp_path / "data"), "--port", "0"],
        cwd=REPO, env={"AGENT_SANDBOX_API_KEY": "secret", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode != 0
    assert "AGENT_SANDBOX_API_KEY" in result.stderr


def test_flags_can_come_from_the_environment(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", env={"AGENT_SANDBOX_DOMAIN": "sbx.example.test"}) as server:
        response = httpx.get(server.url, headers={"Host": "8008-abc.sbx.example.test"})
        assert response.status_code == 502  # routed as a sandbox host of the configured domain


def test_sigterm_stops_the_server_cleanly(tmp_path: Path) -> None:
    with running_server(tmp_path / "data") as server:
        # Everything is closed first, then the signal is raised again: the conventional exit status for SIGTERM.
        assert server.stop(signal.SIGTERM) == -signal.SIGTERM
    log = (tmp_path / "data.server.log").read_text()
    assert "Finished server process" in log
    assert "stopped: everything the server opened is closed" in log
    assert "Traceback" not in log


def test_a_data_dir_the_server_cannot_make_private_is_refused_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in a pod whose data dir is an emptyDir (root's, mode 2777): the server's uid may not chmod it."""

    def not_the_owner(self: Path, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(self))

    monkeypatch.setattr(Path, "chmod", not_the_owner)
    monkeypatch.setattr("gateway._platform.os.getuid", lambda: 10001)  # the gateway pod's uid; root owns the dir
    with pytest.raises(
        SystemExit, match=r"cannot be made private \(0700\): name a directory under it with --data-dir"
    ) as refused:
        _make_private_dir(tmp_path / "data")
    assert "belongs to uid 0, not to this server's uid 10001" in str(refused.value)
    monkeypatch.setattr("gateway._platform.os.getuid", lambda: 0)  # its own dir: ownership is not the reason
    with pytest.raises(PermissionError):
        _make_private_dir(tmp_path / "data")


@pytest.mark.parametrize("retention", [0.0, 604_800.0])
def test_agent_session_retention_is_refused_where_no_copy_is_kept(retention: float, tmp_path: Path) -> None:
    """Not the local runtime: the kubernetes one keeps no copy, so a retention given for it is an error, not ignored
    (even one equal to the default); left out, the server simply keeps no copy."""
    kubernetes: Any = object()  # any runtime but LocalRuntime
    with pytest.raises(SystemExit, match=r"--agent-session-retention: the kubernetes runtime keeps no copy"):
        _agent_mirror(ServeSettings(data_dir=tmp_path, agent_session_retention=retention), kubernetes)
    assert _agent_mirror(ServeSettings(data_dir=tmp_path), kubernetes) is None
    with pytest.raises(SystemExit, match=r"seconds, 0 or more"):
        _agent_mirror(ServeSettings(data_dir=tmp_path, agent_session_retention=-1.0), kubernetes)


def test_agent_session_space_is_refused_where_no_copy_is_kept(tmp_path: Path) -> None:
    kubernetes: Any = object()  # any runtime but LocalRuntime
    with pytest.raises(SystemExit, match=r"--agent-session-space: the kubernetes runtime keeps no copy"):
        _agent_mirror(ServeSettings(data_dir=tmp_path, agent_session_space_mb=4096), kubernetes)
