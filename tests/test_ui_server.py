"""The UI on a real server: where it is served, its live stream, the terminal's WebSocket, and what it reads from a
sandbox's executor (processes, files, downloads)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import websockets
from e2b import Sandbox
from websockets.typing import Origin

from tests.polling import wait_for
from tests.server_fixtures import RunningServer, wait_for_port
from tests.ui_fixtures import new_key, sdk_options, sign_in, ui_server_fixture, ui_url

pytestmark = pytest.mark.anyio

__all__ = ["ui_server_fixture"]  # a fixture, used by name


@pytest.fixture(scope="module")
def key(ui_server: RunningServer) -> str:
    return new_key(ui_server, "ui-server-tests")


@pytest.fixture(scope="module")
def sandbox(ui_server: RunningServer, key: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(metadata={"suite": "ui-server"}, **sdk_options(ui_server, key))
    sandbox.files.write("/home/user/site/index.html", "hello from the sandbox site")
    sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    wait_for_port(sandbox, 8000)
    yield sandbox
    sandbox.kill()


@pytest.fixture
def client(ui_server: RunningServer, key: str) -> Iterator[tuple[httpx.Client, str]]:
    client, csrf = sign_in(ui_server, key)
    try:
        yield client, csrf
    finally:
        client.close()


def test_the_ui_is_never_served_on_a_sandbox_hostname(ui_server: RunningServer, sandbox: Sandbox) -> None:
    host = f"8000-{sandbox.sandbox_id}.sandbox.localhost:{ui_server.port}"
    on_sandbox = httpx.get(f"{ui_server.url}/ui/login", headers={"Host": host})
    assert on_sandbox.status_code == 404  # python's http.server in the sandbox has no /ui/login
    assert "Sign in" not in on_sandbox.text
    assert "File not found" in on_sandbox.text  # python's error page
    closed = httpx.get(f"{ui_server.url}/ui/login", headers={"Host": f"9999-{sandbox.sandbox_id}.sandbox.localhost"})
    assert closed.status_code == 502
    assert "port is not open" in closed.json()["message"]
    by_headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}
    assert "File not found" in httpx.get(f"{ui_server.url}/ui/login", headers=by_headers).text
    assert "Sign in" in httpx.get(f"{ui_url(ui_server)}/ui/login").text  # the control-plane host serves it


def test_the_live_stream_shows_the_sandbox_and_ends_at_sign_out(
    ui_server: RunningServer, sandbox: Sandbox, client: tuple[httpx.Client, str]
) -> None:
    http, csrf = client
    events: list[tuple[str, str]] = []
    with http.stream("GET", "/ui/api/sandboxes/events?metadata=suite%3Dui-server") as stream:
        event = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((event, line.removeprefix("data: ")))
                if event == "snapshot" and len(events) == 1:
                    http.post("/ui/logout", data={"csrf": csrf})  # another request of the same browser
                if event == "signed-out":
                    break
    kind, data = events[0]
    listed = json.loads(data)["sandboxes"]
    assert kind == "snapshot"
    assert [(s["id"], s["state"], s["metadata"]) for s in listed] == [
        (sandbox.sandbox_id, "running", {"suite": "ui-server"})
    ]
    assert listed[0]["mem_used"] > 0
    assert events[-1][0] == "signed-out"


def test_processes_files_and_downloads_come_from_the_executor(
    sandbox: Sandbox, client: tuple[httpx.Client, str]
) -> None:
    http, _ = client
    api = f"/ui/api/sandboxes/{sandbox.sandbox_id}"
    commands = [" ".join([p["cmd"], *p["args"]]) for p in http.get(f"{api}/processes").json()["processes"]]
    assert any("http.server 8000" in command for command in commands)
    listed = http.get(f"{api}/files", params={"path": "/home/user/site"}).json()["entries"]
    assert [(e["name"], e["type"], e["size"]) for e in listed] == [("index.html", "file", 27)]
    download = http.get(f"{api}/download", params={"path": "/home/user/site/index.html"})
    assert download.content == b"hello from the sandbox site"
    assert download.headers["content-disposition"].startswith('attachment; filename="index.html"')
    missing = http.get(f"{api}/download", params={"path": "/home/user/nope.txt"})
    assert missing.status_code == 404
    assert "does not exist" in missing.json()["error"]


def _terminal(server: RunningServer, sandbox: Sandbox, *, csrf: str, origin: str, cookie: str) -> websockets.connect:
    """The terminal's WebSocket, opened as a browser on `origin` with the session `cookie` would open it."""
    url = f"ws://sandbox.localhost:{server.port}/ui/api/sandboxes/{sandbox.sandbox_id}/terminal?csrf={csrf}"
    return websockets.connect(url, origin=Origin(origin), additional_headers={"Cookie": cookie})


@pytest.mark.parametrize("case", ["foreign-origin", "no-csrf", "no-session"])
async def test_the_terminal_refuses_a_handshake_without_origin_session_and_token(
    ui_server: RunningServer, sandbox: Sandbox, client: tuple[httpx.Client, str], case: str
) -> None:
    http, csrf = client
    sandbox_origin = f"http://8000-{sandbox.sandbox_id}.sandbox.localhost:{ui_server.port}"
    origin = sandbox_origin if case == "foreign-origin" else ui_url(ui_server)
    token = "" if case == "no-csrf" else csrf
    cookie = "" if case == "no-session" else f"agent_sandbox_ui={http.cookies['agent_sandbox_ui']}"

    async def handshake() -> None:
        async with _terminal(ui_server, sandbox, csrf=token, origin=origin, cookie=cookie):
            pass

    with pytest.raises(websockets.InvalidStatus) as refused:
        await handshake()
    assert refused.value.response.status_code == 403


async def test_the_terminal_runs_a_shell_and_kills_it_when_closed(
    ui_server: RunningServer, sandbox: Sandbox, client: tuple[httpx.Client, str]
) -> None:
    http, csrf = client
    cookie = f"agent_sandbox_ui={http.cookies['agent_sandbox_ui']}"

    async def session() -> str:
        async with _terminal(ui_server, sandbox, csrf=csrf, origin=ui_url(ui_server), cookie=cookie) as ws:
            await ws.send(json.dumps({"cols": 100, "rows": 30}))
            await ws.send(b"stty size; echo term-$((6*7))\r")
            seen = ""
            async with asyncio.timeout(20):
                while "term-42" not in seen.replace("term-$((6*7))", ""):
                    frame = await ws.recv()
                    seen += frame.decode(errors="replace") if isinstance(frame, bytes) else frame
            return seen

    output = await session()
    assert "30 100" in output  # the resize reached the PTY
    processes = f"/ui/api/sandboxes/{sandbox.sandbox_id}/processes"
    wait_for(
        lambda: not any(p["args"] == ["-i", "-l"] for p in http.get(processes).json()["processes"]),
        what="the shell to end with its terminal",
    )
