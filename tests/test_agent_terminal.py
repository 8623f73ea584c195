"""`/v1/processes/{id}/terminal/ws`: a process's terminal over a WebSocket, framed as sandbox-agent 0.4.2 frames it.

A real executor, real processes (a shell on a PTY, a command that already exited) and the `websockets` client,
with the token in `?access_token=` as the SDK sends it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.agent_fixtures import AgentServer, run_agent_server
from tests.polling import wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def agents() -> Iterator[AgentServer]:
    with run_agent_server() as server:
        yield server


def _start(agents: AgentServer, **body: object) -> str:
    with agents.client() as client:
        created = client.post("/v1/processes", json=body)
        assert created.status_code == 200, created.text
        return str(created.json()["id"])


def _url(agents: AgentServer, process_id: str, token: str | None = None) -> str:
    base = agents.url.replace("http", "ws", 1)
    return f"{base}/v1/processes/{process_id}/terminal/ws?access_token={token or agents.token}"


async def _next_text(ws: ClientConnection) -> object:
    """The next text frame, decoded (output, in binary frames, may come before it)."""
    async with asyncio.timeout(30):
        while not isinstance(message := await ws.recv(), str):
            pass
    return json.loads(message)


async def _output_until(ws: ClientConnection, text: str) -> str:
    seen = ""
    async with asyncio.timeout(30):
        while text not in seen:
            message = await ws.recv()
            assert isinstance(message, bytes), message
            seen += message.decode(errors="replace")
    return seen


async def test_a_shell_on_a_pty_takes_input_and_resizes_and_its_exit_ends_the_socket(agents: AgentServer) -> None:
    process_id = _start(agents, command="/bin/sh", tty=True, interactive=True)
    async with connect(_url(agents, process_id)) as ws:
        assert json.loads(await ws.recv()) == {"type": "ready", "processId": process_id}
        await ws.send(json.dumps({"type": "input", "data": "echo $((40 + 2))\n"}))
        assert "42" in await _output_until(ws, "42")
        await ws.send(json.dumps({"type": "resize", "cols": 132, "rows": 43}))
        await ws.send(json.dumps({"type": "input", "data": "c3R0eSBzaXplCg==", "encoding": "base64"}))  # stty size
        assert "43 132" in await _output_until(ws, "43 132")
        await ws.send(json.dumps({"type": "jump"}))
        assert await _next_text(ws) == {"type": "error", "message": "unknown frame type 'jump': input, resize or close"}
        await ws.send(b"exit 3\n")  # a binary frame is input as it is
        assert await _next_text(ws) == {"type": "exit", "exitCode": 3}
        await ws.wait_closed()


async def test_a_client_that_connects_late_gets_the_output_so_far_and_the_exit(agents: AgentServer) -> None:
    process_id = _start(agents, command="/bin/sh", args=["-c", "echo early"])
    with agents.client() as client:
        wait_for(lambda: client.get(f"/v1/processes/{process_id}").json()["status"] == "exited", what="the exit")
    async with connect(_url(agents, process_id)) as ws:
        frames = [await ws.recv() for _ in range(3)]
    assert json.loads(frames[0])["type"] == "ready"
    assert frames[1] == b"early\n"
    assert json.loads(frames[2]) == {"type": "exit", "exitCode": 0}


async def test_the_close_frame_ends_the_socket_and_the_process_runs_on(agents: AgentServer) -> None:
    process_id = _start(agents, command="/bin/sleep", args=["300"])
    async with connect(_url(agents, process_id)) as ws:
        await ws.recv()  # ready
        await ws.send(json.dumps({"type": "close"}))
        await ws.wait_closed()
    with agents.client() as client:
        assert client.get(f"/v1/processes/{process_id}").json()["status"] == "running"
        client.post(f"/v1/processes/{process_id}/kill")


async def test_a_wrong_token_or_a_plain_get_is_refused(agents: AgentServer) -> None:
    process_id = _start(agents, command="/bin/true")
    with pytest.raises(InvalidStatus) as refused:
        async with connect(_url(agents, process_id, token="wrong")):
            pass
    assert refused.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as missing:
        async with connect(_url(agents, "proc_999999")):
            pass
    assert missing.value.response.status_code == 404
    with agents.client() as client:
        plain = client.get(f"/v1/processes/{process_id}/terminal/ws")
    assert plain.status_code == 400
    assert "WebSocket" in plain.json()["detail"]
    assert httpx.get(f"{agents.url}/v1/processes/{process_id}/terminal/ws").status_code == 401  # no token at all
