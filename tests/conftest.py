"""Shared fixtures: one real `agent-sandbox serve` per test session, and the E2B SDK pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server_fixtures import RunningServer, point_e2b_at, server_in_temp_dir


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with server_in_temp_dir(tmp_path_factory, "server") as running:
        yield running


@pytest.fixture
def e2b_env(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> RunningServer:
    """Point the E2B SDK at the session's server (plain-HTTP single-host recipe)."""
    return point_e2b_at(server, monkeypatch)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
