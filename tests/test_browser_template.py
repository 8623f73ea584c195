"""The `browser` template: Playwright connects over CDP through the gateway with the sandbox's traffic token,
drives the sandbox's Chromium to a page another port of the same sandbox serves; without the token, 403."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from tests.server_fixtures import RunningServer, wait_for_port

pytestmark = pytest.mark.browser  # Playwright


@pytest.fixture
def browser_sandbox(e2b_env: RunningServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("browser", timeout=120)
    yield sandbox
    sandbox.kill()


def _cdp_url(server: RunningServer, sandbox: Sandbox) -> str:
    return f"http://9222-{sandbox.sandbox_id}.sandbox.localhost:{server.port}"


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
    browser_sandbox.files.write("/home/user/site/index.html", "<title>served in the sandbox</title><p>hi</p>")
    browser_sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
    wait_for_port(browser_sandbox, 8000)
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
