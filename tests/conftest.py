"""Shared fixtures: one real `agent-sandbox serve` per test session, and the E2B SDK pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_fixtures import RunningServer, running_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data_dir = tmp_path_factory.mktemp("server") / "data"
    with running_server(data_dir) as running:
        yield running


@pytest.fixture
def e2b_env(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> RunningServer:
    """Point the E2B SDK at the session's server (plain-HTTP single-host recipe)."""
    for name, value in server.e2b_env().items():
        monkeypatch.setenv(name, value)
    return server


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
