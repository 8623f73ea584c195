"""The sandbox page's live views in headless Chromium against a real server: a desktop sandbox's screen in the
Desktop tab (noVNC through the UI's own WebSocket) takes the keys typed and the clicks made on it and leaves the
desktop running when the page goes, a browser
sandbox's Browser tab loads a page the sandbox serves and shows it, and other sandboxes have neither.

The screenshots go to `$AGENT_SANDBOX_SCREENSHOTS` when it is set (`docs/screenshots` refreshes the docs' ones).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

from tests.polling import wait_for
from tests.server_fixtures import RunningServer, wait_for_port
from tests.ui_fixtures import (
    browser_fixture,
    context_fixture,
    new_key,
    page_fixture,
    sdk_options,
    sign_in,
    sign_in_page,
    ui_server_fixture,
)

__all__ = ["browser_fixture", "context_fixture", "page_fixture", "ui_server_fixture"]  # fixtures, used by name

SLOW = 120_000  # ms: a cold desktop starts Xvfb and XFCE first


@pytest.fixture(scope="module")
def key(ui_server: RunningServer) -> str:
    return new_key(ui_server, "ui-live-views")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("AGENT_SANDBOX_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


@pytest.fixture
def desktop(ui_server: RunningServer, key: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("desktop", metadata={"suite": "ui-live-views"}, **sdk_options(ui_server, key))
    yield sandbox
    sandbox.kill()


def focused_window(sandbox: Sandbox) -> str:
    probe = sandbox.commands.run("xdotool getwindowname $(xdotool getwindowfocus) || true", envs={"DISPLAY": ":0"})
    return probe.stdout


def test_the_desktop_tab_shows_the_screen_and_sends_it_keys_and_clicks(
    page: Any, ui_server: RunningServer, key: str, desktop: Sandbox, shots: Path
) -> None:
    sign_in_page(page, ui_server, key, then=f"/ui/sandboxes/{desktop.sandbox_id}")
    assert page.locator('[data-tab="browser"]').count() == 0
    page.click('[data-tab="desktop"]')
    page.locator('#desktop[data-connected="true"]').wait_for(timeout=SLOW)  # the desktop started by the view
    canvas = page.locator("#desktop canvas")
    assert canvas.evaluate("c => [c.width, c.height]") == [1024, 768]  # the screen's own size, scaled to fit

    desktop.commands.run("xfce4-terminal >/dev/null 2>&1", background=True, envs={"DISPLAY": ":0"})
    wait_for(lambda: "Terminal" in focused_window(desktop) or None, what="the terminal's window to have the focus")
    canvas.focus()  # noVNC sends the keys of its focused canvas
    page.keyboard.type("echo typed-in-the-ui > /tmp/ui-typed\n")
    wait_for(
        lambda: desktop.commands.run("cat /tmp/ui-typed 2>/dev/null || true").stdout == "typed-in-the-ui\n" or None,
        what="the command typed through the desktop view to run",
    )
    page.locator("#desktop-status", has_text=re.compile(r"^Connected")).wait_for()
    page.screenshot(path=shots / "sandbox-desktop.png", full_page=True)

    box = canvas.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] / 4, box["y"] + box["height"] / 4)  # screen pixel (256, 192)

    def pointer_there() -> bool | None:
        where = desktop.commands.run("xdotool getmouselocation", envs={"DISPLAY": ":0"}).stdout
        found = re.match(r"x:(\d+) y:(\d+)", where)
        return (found is not None and abs(int(found[1]) - 256) <= 4 and abs(int(found[2]) - 192) <= 4) or None

    wait_for(pointer_there, what="the pointer where the page was clicked (scaled back to the screen's pixels)")

    page.goto("about:blank")  # the page leaves: its VNC server goes, the desktop it started stays

    def viewer_gone() -> bool | None:
        return desktop.commands.run("pgrep -f 'x11vnc -[i]netd' || true").stdout == "" or None

    wait_for(viewer_gone, what="the view's x11vnc to end with the page")
    assert desktop.commands.run("xdpyinfo -display :0 >/dev/null && pgrep -x xfdesktop").exit_code == 0


def test_the_browser_tab_loads_a_page_the_sandbox_serves_and_shows_it(
    page: Any, ui_server: RunningServer, key: str, shots: Path
) -> None:
    sandbox = Sandbox.create("browser", metadata={"suite": "ui-live-views"}, **sdk_options(ui_server, key))
    try:
        sandbox.files.write("/home/user/site/index.html", "<title>Seen in the UI</title><h1>the sandbox's page</h1>")
        sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
        wait_for_port(sandbox, 8000)
        sign_in_page(page, ui_server, key, then=f"/ui/sandboxes/{sandbox.sandbox_id}")
        assert page.locator('[data-tab="desktop"]').count() == 0
        page.click('[data-tab="browser"]')
        page.locator("#browser-shot[src^='data:image/png;base64,']").wait_for(timeout=SLOW)  # the page open now
        page.fill("#browser-url", "http://localhost:8000/")
        page.click("#browser-go")
        page.locator("#browser-title", has_text="Seen in the UI").wait_for(timeout=SLOW)
        page.locator('#browser-shot[data-url="http://localhost:8000/"]').wait_for()
        page.screenshot(path=shots / "sandbox-browser.png", full_page=True)
    finally:
        sandbox.kill()


def test_a_sandbox_without_a_desktop_or_browser_has_no_view_and_its_view_routes_refuse(
    ui_server: RunningServer, key: str
) -> None:
    sandbox = Sandbox.create(metadata={"suite": "ui-live-views"}, **sdk_options(ui_server, key))
    client, csrf = sign_in(ui_server, key)
    try:
        page = client.get(f"/ui/sandboxes/{sandbox.sandbox_id}")
        assert 'data-tab="desktop"' not in page.text
        assert 'data-tab="browser"' not in page.text
        refused = client.get(f"/ui/api/sandboxes/{sandbox.sandbox_id}/browser")
        assert (refused.status_code, refused.json()) == (
            409, {"error": f"sandbox {sandbox.sandbox_id} has no browser (template base)"},
        )  # fmt: skip
        unsigned = client.post(
            f"/ui/api/sandboxes/{sandbox.sandbox_id}/browser/navigate", json={"url": "http://localhost/"}
        )
        assert unsigned.status_code == 403  # no CSRF token
        bad = client.post(
            f"/ui/api/sandboxes/{sandbox.sandbox_id}/browser/navigate", json={"url": ""},
            headers={"X-CSRF-Token": csrf},
        )  # fmt: skip
        assert bad.status_code == 400
    finally:
        client.close()
        sandbox.kill()
