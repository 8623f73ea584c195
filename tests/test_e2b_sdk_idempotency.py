"""`Sandbox.create(idempotency_key=...)` with the real `e2b` SDK, as an E2B user (or the SDK's own retry) sends it."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxException, SandboxQuery

from tests.server_fixtures import RunningServer, point_e2b_at, running_server

pytestmark = pytest.mark.anyio


def new_key() -> str:
    return f"create-{uuid.uuid4().hex}"


def test_the_same_key_twice_gives_one_sandbox(e2b_env: RunningServer) -> None:
    key = new_key()
    tag = {"suite": key}
    first = Sandbox.create(metadata=tag, timeout=120, idempotency_key=key)
    try:
        again = Sandbox.create(metadata=tag, timeout=120, idempotency_key=key)
        assert again.sandbox_id == first.sandbox_id
        assert [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata=tag)).next_items()] == [first.sandbox_id]
        assert again.commands.run("echo replayed").stdout == "replayed\n"  # the replayed answer's token works
    finally:
        first.kill()


def test_another_body_with_the_same_key_is_the_mismatch_error(e2b_env: RunningServer) -> None:
    key = new_key()
    first = Sandbox.create(timeout=120, idempotency_key=key)
    try:
        with pytest.raises(SandboxException, match=r"^422: .*another request body"):
            Sandbox.create(timeout=121, idempotency_key=key)
        answer = httpx.post(
            f"{e2b_env.url}/v2/sandboxes",
            headers={"X-API-Key": e2b_env.api_key, "Idempotency-Key": key},
            json={"templateID": "base", "timeout": 122},
        )
        assert (answer.status_code, answer.json()["error_code"]) == (422, "idempotency_request_mismatch")
    finally:
        first.kill()


def test_a_key_outside_the_sdks_alphabet_is_refused(e2b_env: RunningServer) -> None:
    answer = httpx.post(
        f"{e2b_env.url}/v2/sandboxes",
        headers={"X-API-Key": e2b_env.api_key, "Idempotency-Key": "Not_Valid"},
        json={"templateID": "base"},
    )
    assert (answer.status_code, answer.json()["code"]) == (400, 400)
    assert "Idempotency-Key" in answer.json()["message"]


async def test_the_async_sdk_replays_the_same_sandbox(e2b_env: RunningServer) -> None:
    key = new_key()
    first = await AsyncSandbox.create(timeout=120, idempotency_key=key)
    try:
        again = await AsyncSandbox.create(timeout=120, idempotency_key=key)
        assert again.sandbox_id == first.sandbox_id
    finally:
        await first.kill()


def test_a_restart_keeps_the_key_and_its_answer(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = new_key()
    with running_server(data_dir) as first:
        point_e2b_at(first, monkeypatch)
        made = Sandbox.create(timeout=120, idempotency_key=key).sandbox_id
    with running_server(data_dir) as second:  # the first one's sandboxes were cleaned up when it stopped
        point_e2b_at(second, monkeypatch)
        assert Sandbox.create(timeout=120, idempotency_key=key).sandbox_id == made
        assert Sandbox.list().next_items() == []  # replayed: no second sandbox was made
