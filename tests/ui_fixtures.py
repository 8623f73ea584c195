"""Fixtures of the UI's tests: a server with the UI, a signed-in browser (Playwright on Debian's Chromium), and
a sandbox made through the E2B API. Import fixtures under their `*_fixture` names.

The browser opens the UI at `http://sandbox.localhost:<port>/ui`: the sandbox domain itself, so that a sandbox page
at `<port>-<id>.sandbox.localhost` is the *same site* as the UI. That is the harder case for the session cookie
(SameSite=Strict does not keep it off same-site requests), which the tests must show is still safe.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_fixtures import REPO, RunningServer, running_server

__all__ = [
    "CHROMIUM", "CHROMIUM_ARGS", "browser_fixture", "context_fixture", "new_key", "sdk_options", "sign_in",
    "ui_server_fixture", "ui_url",
]  # fmt: skip

CHROMIUM = Path(os.environ.get("AGENT_SANDBOX_CHROMIUM", "/usr/bin/chromium"))
# The flags that work on these machines (closed network, root, no GPU): see the machine notes.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip


def ui_url(server: RunningServer) -> str:
    """The UI's base URL on the sandbox domain itself (see the module docstring)."""
    return f"http://sandbox.localhost:{server.port}"


def new_key(server: RunningServer, name: str) -> str:
    """A new API key of the server (`agent-sandbox keys create`): a user with no sandboxes yet."""
    argv = [sys.executable, "-m", "cli", "keys", "create", "--name", name, "--data-dir", str(server.data_dir)]
    created = subprocess.run(argv, cwd=REPO, check=True, capture_output=True, text=True)
    return created.stdout.split()[0]


def sdk_options(server: RunningServer, key: str) -> dict[str, Any]:
    """The E2B SDK's connection options for `key` on `server` (plain-HTTP single host)."""
    return {"api_key": key, "api_url": server.url, "sandbox_url": server.url}


def sign_in(server: RunningServer, key: str) -> tuple[httpx.Client, str]:
    """An HTTP client signed in to the UI as `key` (sending the UI's Origin, as a browser would), and its CSRF token."""
    base = ui_url(server)
    client = httpx.Client(base_url=base, headers={"Origin": base}, timeout=30)
    signed_in = client.post("/ui/login", data={"key": key})
    match = re.search(r'name="csrf-token" content="([^"]+)"', client.get("/ui/sandboxes").text)
    if signed_in.status_code != 303 or match is None:
        client.close()
        raise AssertionError(f"sign-in failed: {signed_in.status_code} {signed_in.text[:200]}")
    return client, match.group(1)


@pytest.fixture(name="ui_server", scope="session")
def ui_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server of the UI tests' own, with a live warm pool for the Pools page."""
    with running_server(tmp_path_factory.mktemp("ui-server") / "data", "--warm", "base=1") as running:
        yield running


@pytest.fixture(name="browser", scope="module")  # Playwright's loop must end before async tests run
def browser_fixture() -> Iterator[Any]:
    """Headless Debian Chromium driven by Playwright (its own browser download does not work here)."""
    if not CHROMIUM.exists() and os.environ.get("CI") != "true":
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(name="context")
def context_fixture(browser: Any) -> Iterator[Any]:
    """A fresh browser profile (no cookies) per test."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(name="page")
def page_fixture(context: Any) -> Iterator[Any]:
    """A page that fails the test on any script error or console error (a refused sign-in's 401 aside)."""
    page = context.new_page()
    problems: list[str] = []

    def console(message: Any) -> None:
        if message.type == "error" and "status of 401" not in message.text:
            problems.append(f"console: {message.text}")

    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("console", console)
    yield page
    assert problems == [], problems


def sign_in_page(page: Any, server: RunningServer, key: str, *, then: str = "/ui/sandboxes") -> None:
    """Sign `page` in as `key` from the sign-in form `then` redirects to, and wait until it is back at `then`."""
    page.goto(f"{ui_url(server)}{then}")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url(f"**{then}")
