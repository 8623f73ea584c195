"""Revoking a key (`agent-sandbox keys revoke`, run beside the server as an operator runs it) refuses it at once
everywhere (API, MCP, an open UI session) and, once the server's grace period has passed, kills its sandboxes;
the key stays listed as revoked."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator

import httpx
import pytest
import websockets
from e2b import Sandbox
from websockets.typing import Origin

from activator import ApiKeys, Store
from tests import test_activator_fakes as fakes
from tests.key_fixtures import create_key, keys_command
from tests.polling import DEADLINE, wait_for
from tests.server_fixtures import RunningServer, server_in_temp_dir
from tests.ui_fixtures import sdk_options, sign_in, ui_url

store = fakes.store  # the shared fixture, bound by name for pytest
GRACE = 15.0


@pytest.mark.anyio
async def test_the_reaper_kills_a_revoked_keys_sandboxes_only_after_the_grace(store: Store) -> None:
    clock = fakes.Clock()
    keys = ApiKeys(store, clock=clock)
    (revoked, _), (kept, _) = await keys.create("revoked"), await keys.create("kept")
    act = fakes.activator(store, fakes.FakeRuntime(), clock, revoked_key_grace=GRACE)
    running = await act.create(revoked.id, fakes.request())
    paused = await act.create(revoked.id, fakes.request())
    await act.pause(revoked.id, paused.id)
    other = await act.create(kept.id, fakes.request())
    assert await keys.revoke(revoked.id)
    clock.advance(GRACE - 1)
    await act.reap_once()
    assert set(act.live) == {running.id, paused.id, other.id}
    clock.advance(6)  # past the grace, and past the reaper's next look for revoked keys
    await act.reap_once()
    assert set(act.live) == {other.id}


@pytest.fixture(scope="module")
def revoking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with server_in_temp_dir(tmp_path_factory, "revoke", "--revoked-key-grace", str(GRACE)) as running:
        yield running


def _mcp_status(server: RunningServer, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    return httpx.post(f"{server.url}/mcp", json=body, headers=headers, timeout=30).status_code


def test_a_revoked_key_is_refused_everywhere_and_its_sandbox_killed_after_the_grace(
    revoking_server: RunningServer,
) -> None:
    key, key_id = create_key(revoking_server, "--name", "leaving")
    ui, _ = sign_in(revoking_server, key)
    sandbox = Sandbox.create(**sdk_options(revoking_server, key))
    assert ui.get("/ui/sandboxes").status_code == 200
    assert _mcp_status(revoking_server, key) == 200

    keys_command(revoking_server, "revoke", key_id)
    assert ui.get("/ui/sandboxes", follow_redirects=False).status_code == 303  # the session ended at once
    wait_for(lambda: _mcp_status(revoking_server, key) == 401, what="MCP to refuse the revoked key")
    listing = f"{revoking_server.url}/v2/sandboxes"
    wait_for(lambda: httpx.get(listing, headers={"X-API-Key": key}).status_code == 401, what="the API to refuse it")
    assert sandbox.is_running()  # the grace has not passed (envd answers its own token, no API key needed)
    listed = keys_command(revoking_server, "list")
    assert re.search(rf"^{key_id}\tleaving\t.*\trevoked \d+$", listed, re.MULTILINE), listed

    wait_for(lambda: not sandbox.is_running(), what="the revoked key's sandbox to be killed after the grace")
    log = (revoking_server.data_dir.parent / f"{revoking_server.data_dir.name}.server.log").read_text()
    assert f"sandbox={sandbox.sandbox_id} transition=running->killed reason=revoked" in log
    ui.close()


@pytest.mark.anyio
async def test_a_revoked_keys_open_terminal_is_closed_and_its_shell_ends(revoking_server: RunningServer) -> None:
    key, key_id = create_key(revoking_server)
    http, csrf = sign_in(revoking_server, key)
    sandbox = Sandbox.create(**sdk_options(revoking_server, key))
    url = f"ws://sandbox.localhost:{revoking_server.port}/ui/api/sandboxes/{sandbox.sandbox_id}/terminal?csrf={csrf}"
    cookie = {"Cookie": f"agent_sandbox_ui={http.cookies['agent_sandbox_ui']}"}
    async with websockets.connect(url, origin=Origin(ui_url(revoking_server)), additional_headers=cookie) as ws:
        await ws.send(b"echo ready-$((6*7))\r")
        async with asyncio.timeout(DEADLINE):
            while "ready-42" not in (await ws.recv(decode=False)).decode(errors="replace"):
                pass
            await asyncio.to_thread(keys_command, revoking_server, "revoke", key_id)
            while isinstance(frame := await ws.recv(), bytes):
                pass
    assert "signed out" in json.loads(frame)["error"]
    http.close()
