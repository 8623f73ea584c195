"""`/metrics` wants an API key by default (`--metrics-auth key`), and `--metrics-listen HOST:PORT` moves it to a
listener of its own (here with `--metrics-auth none`), off the main one."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server_fixtures import RunningServer, free_port, server_in_temp_dir


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"X-API-Key": "e2b_" + "0" * 32}, 401),
        ({"X-API-Key": "{key}"}, 200),
        ({"Authorization": "Bearer {key}"}, 200),
    ],
    ids=["no-key", "wrong-key", "x-api-key", "bearer"],
)
def test_metrics_want_a_key_by_default(server: RunningServer, headers: dict[str, str], status: int) -> None:
    sent = {name: value.format(key=server.api_key) for name, value in headers.items()}
    answer = httpx.get(f"{server.url}/metrics", headers=sent)
    assert answer.status_code == status
    if status == 200:
        assert "agent_sandbox_sandboxes{" in answer.text
    else:
        assert answer.json()["code"] == 401


@pytest.fixture(scope="module")
def apart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    port = free_port()
    flags = ["--metrics-listen", f"127.0.0.1:{port}", "--metrics-auth", "none"]
    with server_in_temp_dir(tmp_path_factory, "metrics-apart", *flags) as running:
        yield running, f"http://127.0.0.1:{port}"


def test_a_separate_listener_serves_metrics_alone_and_the_main_one_none(apart: tuple[RunningServer, str]) -> None:
    server, listener = apart
    scraped = httpx.get(f"{listener}/metrics")
    assert scraped.status_code == 200
    assert "agent_sandbox_held_requests" in scraped.text
    assert httpx.get(f"{listener}/health").status_code == 404
    assert httpx.get(f"{server.url}/metrics", headers={"X-API-Key": server.api_key}).status_code == 404
