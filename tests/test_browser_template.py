"""The `browser` template: Playwright connects over CDP through the gateway with the sandbox's traffic token,
drives the sandbox's Chromium to a page another port of the same sandbox serves; without the token, 403."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from e2b import Sandbox

from tests.server_fixtures import RunningServer, server_in_temp_dir, wait_for_port

pytestmark = pytest.mark.browser  # Playwright


@pytest.fixture
def browser_sandbox(e2b_env: RunningServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("browser", timeout=120)
    yield sandbox
    sandbox.kill()


def _cdp_url(server: RunningServer, sandbox: Sandbox) -> str:
    return f"http://9222-{sandbox.sandbox_id}.sandbox.localhost:{server.port}"


def _serve_page(sandbox: Sandbox, html: str) -> None:
    """Serve `html` at http://localhost:8000/ inside the sandbox, from a server of its own."""
    sandbox.files.write("/home/user/site/index.html", html)
    sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
    wait_for_port(sandbox, 8000)


def test_the_cdp_port_needs_the_traffic_token_though_the_sandbox_is_public(
    e2b_env: RunningServer, browser_sandbox: Sandbox
) -> None:
    token = browser_sandbox.traffic_access_token
    assert token  # a browser sandbox always has one: its CDP port is private
    url = _cdp_url(e2b_env, browser_sandbox) + "/json/version"
    refused = httpx.get(url)
    assert refused.status_code == 403
    assert "traffic access token" in refused.json()["message"]
    version = httpx.get(url, headers={"e2b-traffic-access-token": token})
    assert version.status_code == 200
    assert version.json()["Browser"].startswith(("Chrome/", "HeadlessChrome/"))
    browser_sandbox.commands.run("python3 -m http.server 8000", background=True)
    wait_for_port(browser_sandbox, 8000)
    assert httpx.get(f"http://8000-{browser_sandbox.sandbox_id}.sandbox.localhost:{e2b_env.port}/").status_code == 200


def test_playwright_drives_the_sandboxs_chromium_over_cdp(e2b_env: RunningServer, browser_sandbox: Sandbox) -> None:
    sync_api: Any = pytest.importorskip("playwright.sync_api")
    _serve_page(browser_sandbox, "<title>served in the sandbox</title><p>hi</p>")
    headers = {"e2b-traffic-access-token": browser_sandbox.traffic_access_token or ""}
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(_cdp_url(e2b_env, browser_sandbox), headers=headers)
        try:
            page = browser.contexts[0].new_page()
            page.goto("http://localhost:8000/")
            assert page.title() == "served in the sandbox"
            assert page.locator("p").inner_text() == "hi"
        finally:
            browser.close()


def test_a_paused_browser_comes_back_with_its_tab(e2b_env: RunningServer, browser_sandbox: Sandbox) -> None:
    """A pause snapshots the browser to zero with CRIU; after connect the same Chromium has the same tab."""
    sync_api: Any = pytest.importorskip("playwright.sync_api")
    _serve_page(browser_sandbox, "<title>kept across a pause</title>")
    headers = {"e2b-traffic-access-token": browser_sandbox.traffic_access_token or ""}
    pids = browser_sandbox.commands.run("pgrep -o -x chromium").stdout
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(_cdp_url(e2b_env, browser_sandbox), headers=headers)
        browser.contexts[0].pages[0].goto("http://localhost:8000/")
        browser.close()
    assert browser_sandbox.pause()
    assert (e2b_env.data_dir / "sandboxes" / browser_sandbox.sandbox_id / "checkpoint" / "inventory.img").is_file()
    resumed = Sandbox.connect(browser_sandbox.sandbox_id)
    assert resumed.commands.run("pgrep -o -x chromium").stdout == pids  # restored, not started again
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(_cdp_url(e2b_env, browser_sandbox), headers=headers)
        try:
            pages = browser.contexts[0].pages
            assert [(page.url, page.title()) for page in pages] == [("http://localhost:8000/", "kept across a pause")]
            pages[0].reload()  # the sandbox's own server came back too
            assert pages[0].title() == "kept across a pause"
        finally:
            browser.close()


@pytest.fixture(scope="module")
def domain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose sandbox domain is not `*.localhost`: Chromium refuses such a Host by itself."""
    with server_in_temp_dir(tmp_path_factory, "cdp-domain", "--domain", "sandboxes.example.test") as running:
        yield running


def test_cdp_works_on_any_domain_the_gateway_presents_localhost_and_rewrites_the_answers(
    domain_server: RunningServer,
) -> None:
    server = domain_server
    sandbox = Sandbox.create("browser", timeout=120, api_key=server.api_key, api_url=server.url, sandbox_url=server.url)
    try:
        public = f"9222-{sandbox.sandbox_id}.sandboxes.example.test:{domain_server.port}"
        headers = {"Host": public, "e2b-traffic-access-token": sandbox.traffic_access_token or ""}
        version = httpx.get(f"{domain_server.url}/json/version", headers=headers)
        assert version.status_code == 200, version.text
        ws_url = version.json()["webSocketDebuggerUrl"]
        assert ws_url.startswith(f"ws://{public}/devtools/browser/")

        async def browser_version() -> dict[str, Any]:
            token = {"e2b-traffic-access-token": headers["e2b-traffic-access-token"]}
            # The URL as Chromium's answer names it (its Host), dialled at this machine's gateway.
            connect = websockets.connect(ws_url, additional_headers=token, host="127.0.0.1", port=domain_server.port)
            async with connect as cdp:
                await cdp.send(json.dumps({"id": 1, "method": "Browser.getVersion"}))
                answer: dict[str, Any] = json.loads(await cdp.recv())
                return answer

        assert asyncio.run(browser_version())["result"]["product"].startswith(("Chrome/", "HeadlessChrome/"))
    finally:
        sandbox.kill()
