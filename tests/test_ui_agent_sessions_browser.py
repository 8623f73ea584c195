"""The Sessions tab in headless Chromium against a real server and sandbox, with the builtin mock agent: start a
session from the form, prompt it, approve its permission request with the button, see the tool's output appear
without a reload (and the file in the sandbox), and an agent's text with a script tag shown as text, never run.

The screenshot goes to `$AGENT_SANDBOX_SCREENSHOTS` when it is set (`docs/screenshots` refreshes the docs' one).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

from tests.server_fixtures import RunningServer
from tests.ui_fixtures import (
    browser_fixture,
    context_fixture,
    new_key,
    page_fixture,
    sdk_options,
    ui_server_fixture,
    ui_url,
)

__all__ = ["browser_fixture", "context_fixture", "page_fixture", "ui_server_fixture"]  # fixtures, used by name

SLOW = 180_000  # ms a turn of the mock may take on a loaded machine (generous: nothing here measures time)


@pytest.fixture(scope="module")
def key(ui_server: RunningServer) -> str:
    return new_key(ui_server, "ui-agent-sessions-browser")


@pytest.fixture(scope="module")
def sandbox(ui_server: RunningServer, key: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(metadata={"suite": "ui-agent-sessions-browser"}, **sdk_options(ui_server, key))
    yield sandbox
    sandbox.kill()


def test_a_session_is_started_prompted_and_approved_from_the_sessions_tab(
    page: Any, ui_server: RunningServer, key: str, sandbox: Sandbox, tmp_path: Path
) -> None:
    shots = Path(os.environ.get("AGENT_SANDBOX_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    page.goto(f"{ui_url(ui_server)}/ui/sandboxes/{sandbox.sandbox_id}")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url(f"**/ui/sandboxes/{sandbox.sandbox_id}")

    page.click('[data-tab="sessions"]')
    page.locator("#session-create").wait_for()
    assert page.input_value("#session-agent") == "mock"
    page.fill("#session-id", "ui-browser")
    page.click("#session-start")
    page.locator('#transcript-body[data-session="ui-browser"]').wait_for(timeout=SLOW)
    page.locator('#sessions-table [data-open-session="ui-browser"]').wait_for()

    page.fill("#prompt-input", "$ echo hi > /tmp/ui-browser.txt && cat /tmp/ui-browser.txt")
    page.click("#prompt-send")
    approve = page.locator('#transcript [data-reply="once"]')
    approve.wait_for(timeout=SLOW)  # the permission request appears while the tab polls
    assert page.locator('#transcript [data-reply="reject"]').count() == 1
    page.screenshot(path=shots / "sandbox-sessions.png", full_page=True)
    approve.click()
    page.locator("#transcript pre.output", has_text="hi").wait_for(timeout=SLOW)
    page.locator('#transcript-body[data-live="0"]').wait_for(timeout=SLOW)
    assert page.locator('#transcript [data-reply="once"]').count() == 0
    assert sandbox.files.read("/tmp/ui-browser.txt") == "hi\n"

    page.fill("#prompt-input", "<script>window.pwned = 1</script><img src=x onerror=window.pwned=2>")
    page.click("#prompt-send")
    reply = page.locator("#transcript .entry-agent .text", has_text="Mock reply to: <script>")
    reply.wait_for(timeout=SLOW)  # shown as text
    assert "<img src=x onerror=window.pwned=2>" in reply.inner_text()
    assert page.locator("#transcript script, #transcript img").count() == 0
    assert page.evaluate("typeof window.pwned") == "undefined"
