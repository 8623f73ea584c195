"""The UI in headless Chromium against a real server: sign in, watch a sandbox appear, pause and resume it, open a
port URL, type in the terminal, sign out; and a page served from a sandbox hostname cannot read or use the session.

Screenshots of every page go to `$AGENT_SANDBOX_SCREENSHOTS` when it is set (`docs/screenshots` refreshes the
docs' pictures); otherwise to the test's temporary directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import Sandbox

from tests.server_fixtures import RunningServer, wait_for_port
from tests.ui_fixtures import (
    browser_fixture,
    context_fixture,
    new_key,
    page_fixture,
    sdk_options,
    sign_in_page,
    ui_server_fixture,
    ui_url,
)

__all__ = ["browser_fixture", "context_fixture", "page_fixture", "ui_server_fixture"]  # fixtures, used by name

COOKIE = "agent_sandbox_ui"
SLOW = 60_000  # ms: a pause takes a snapshot, a resume restores it
_COOKIE_ECHO = """
import http.server
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("cookie header: " + (self.headers.get("Cookie") or "none")).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
http.server.HTTPServer(("127.0.0.1", 8001), Echo).serve_forever()
"""


@pytest.fixture(scope="module")
def key(ui_server: RunningServer) -> str:
    """A key of its own: a new user, whose list starts empty."""
    return new_key(ui_server, "browser-tests")


@pytest.fixture(scope="module")
def sandbox(ui_server: RunningServer, key: str) -> Iterator[Sandbox]:
    """A sandbox serving a page on port 8000 and echoing its requests' Cookie header on port 8001."""
    sandbox = Sandbox.create(metadata={"suite": "browser"}, **sdk_options(ui_server, key))
    sandbox.files.write("/home/user/site/index.html", "<h1>hello from the sandbox site</h1>")
    sandbox.files.write("/home/user/echo.py", _COOKIE_ECHO)
    sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000 --bind 127.0.0.1", background=True)
    sandbox.commands.run("python3 /home/user/echo.py", background=True)
    wait_for_port(sandbox, 8000)
    wait_for_port(sandbox, 8001)
    yield sandbox
    sandbox.kill()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("AGENT_SANDBOX_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


def test_sign_in_keeps_only_an_opaque_host_only_cookie_and_sign_out_ends_it(
    page: Any, context: Any, ui_server: RunningServer, key: str, shots: Path
) -> None:
    page.goto(f"{ui_url(ui_server)}/ui/sandboxes")
    page.wait_for_url("**/ui/login?next=%2Fui%2Fsandboxes")
    page.screenshot(path=shots / "login.png")
    page.fill("#key", "e2b_" + "0" * 32)
    page.click("button[type=submit]")
    assert "not an API key of this server" in page.inner_text(".alert")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/sandboxes")
    page.wait_for_selector("#empty:not([hidden])")  # a new user: the clear empty state
    page.wait_for_selector("#live.on")
    page.screenshot(path=shots / "sandboxes-empty.png")

    cookies = context.cookies()
    assert [(c["name"], c["domain"], c["path"], c["httpOnly"], c["sameSite"]) for c in cookies] == [
        (COOKIE, "sandbox.localhost", "/ui", True, "Strict")  # no leading dot: host-only
    ]
    assert key not in cookies[0]["value"]
    stored = page.evaluate("JSON.stringify([localStorage, sessionStorage, document.cookie])")
    assert key not in stored
    assert COOKIE not in stored  # HttpOnly: no script reads it
    assert key not in page.content()

    page.click("#sign-out")
    page.wait_for_url("**/ui/login?signed_out=1")
    assert "You are signed out" in page.inner_text(".notice")
    assert context.cookies() == []
    page.goto(f"{ui_url(ui_server)}/ui/sandboxes")
    page.wait_for_url("**/ui/login?next=%2Fui%2Fsandboxes")


def test_a_sandbox_created_through_the_api_appears_then_pauses_and_resumes_from_the_ui(
    page: Any, ui_server: RunningServer, key: str, shots: Path
) -> None:
    sign_in_page(page, ui_server, key, then="/ui/sandboxes?metadata=suite%3Dlive")
    page.wait_for_selector("#live.on")
    sandbox = Sandbox.create(metadata={"suite": "live", "owner": "ana"}, **sdk_options(ui_server, key))
    try:
        row = f'tr[data-id="{sandbox.sandbox_id}"]'
        page.wait_for_selector(f'{row}[data-state="running"]')  # appears without a reload
        page.screenshot(path=shots / "sandboxes.png")
        page.click(f'{row} [data-action="pause"]')
        page.wait_for_selector(f'{row}[data-state="snapshotted"]', timeout=SLOW)
        assert "E2B: paused" in page.inner_text(row)  # the internal state, and what the API reports
        assert sandbox.get_info().state == "paused"
        page.screenshot(path=shots / "sandboxes-paused.png")
        page.click(f'{row} [data-action="resume"]')
        page.wait_for_selector(f'{row}[data-state="running"]', timeout=SLOW)
        assert sandbox.get_info().state == "running"
        assert sandbox.commands.run("echo alive").stdout == "alive\n"
    finally:
        sandbox.kill()
    page.wait_for_selector(f'tr[data-id="{sandbox.sandbox_id}"]', state="detached")


def test_a_port_url_opens_the_server_running_in_the_sandbox(
    page: Any, context: Any, ui_server: RunningServer, key: str, sandbox: Sandbox, shots: Path
) -> None:
    sign_in_page(page, ui_server, key, then=f"/ui/sandboxes/{sandbox.sandbox_id}")
    page.wait_for_selector("#live.on")
    page.fill("#port-input", "8000")
    page.click("#add-port")
    link = page.locator('li[data-port="8000"] a')
    expected = f"http://8000-{sandbox.sandbox_id}.sandbox.localhost:{ui_server.port}"
    assert link.get_attribute("href") == expected
    page.screenshot(path=shots / "sandbox.png", full_page=True)
    with context.expect_page() as opened:
        link.click()
    site = opened.value
    site.wait_for_load_state()
    assert site.inner_text("h1") == "hello from the sandbox site"
    site.close()


def test_the_terminal_runs_what_is_typed(
    page: Any, ui_server: RunningServer, key: str, sandbox: Sandbox, shots: Path
) -> None:
    sign_in_page(page, ui_server, key, then=f"/ui/sandboxes/{sandbox.sandbox_id}")
    page.click('[data-tab="terminal"]')
    # A locator, not wait_for_function: polling a string predicate evals it, which the UI's CSP refuses.
    page.locator("#terminal-status", has_text=re.compile(r"^Connected")).wait_for()  # not "Disconnected"
    rows = page.locator("#terminal .xterm-rows")
    rows.filter(has_text="$").wait_for()  # the prompt
    page.keyboard.type("echo ui-$((6*7)); uname -s\n")
    rows.filter(has_text="Linux").wait_for()  # the second command's output: the first one's came before it
    assert "ui-42" in rows.inner_text()
    page.screenshot(path=shots / "sandbox-terminal.png", full_page=True)


def test_processes_files_templates_and_pools_render(
    page: Any, ui_server: RunningServer, key: str, sandbox: Sandbox, shots: Path
) -> None:
    sign_in_page(page, ui_server, key, then=f"/ui/sandboxes/{sandbox.sandbox_id}")
    page.click('[data-tab="processes"]')
    page.locator("#processes-table").filter(has_text="http.server 8000").wait_for()
    page.screenshot(path=shots / "sandbox-processes.png", full_page=True)
    page.click('[data-tab="files"]')
    page.locator('#files-table [data-dir="/home/user/site"]').click()
    page.locator('#files-table tr[data-path="/home/user/site/index.html"]').wait_for()
    with page.expect_download() as download:
        page.click('#files-table tr[data-path="/home/user/site/index.html"] a')
    assert Path(download.value.path()).read_text() == "<h1>hello from the sandbox site</h1>"
    page.screenshot(path=shots / "sandbox-files.png", full_page=True)
    page.goto(f"{ui_url(ui_server)}/ui/templates")
    assert page.locator("#template-base").is_visible()
    page.screenshot(path=shots / "templates.png", full_page=True)
    page.goto(f"{ui_url(ui_server)}/ui/pools")
    page.wait_for_selector("#pool-table tbody tr, #no-pools")
    page.screenshot(path=shots / "pools.png", full_page=True)


def test_a_page_on_a_sandbox_hostname_cannot_read_or_use_the_ui_session(
    context: Any, ui_server: RunningServer, key: str, sandbox: Sandbox
) -> None:
    ui = context.new_page()
    sign_in_page(ui, ui_server, key)
    assert [c["name"] for c in context.cookies(ui_url(ui_server) + "/ui/")] == [COOKIE]
    sandbox_origin = f"http://8001-{sandbox.sandbox_id}.sandbox.localhost:{ui_server.port}"
    assert context.cookies(sandbox_origin + "/ui/") == []  # the browser's own verdict: never sent there

    evil = context.new_page()
    evil.goto(sandbox_origin + "/ui/sandboxes")
    assert evil.inner_text("body") == "cookie header: none"  # the sandbox's server never receives it
    assert COOKIE not in evil.evaluate("document.cookie")
    kill = f"{ui_url(ui_server)}/ui/api/sandboxes/{sandbox.sandbox_id}/kill"
    # A same-site request with the cookie attached (SameSite=Strict allows it), without the CSRF token a foreign
    # page cannot read, and from the sandbox's origin: refused.
    send = "url => fetch(url, {method: 'POST', mode: 'no-cors', credentials: 'include', body: '{}'})"
    answer = evil.evaluate(f"url => ({send})(url).then(() => 'an answer', error => String(error))", kill)
    assert answer == "TypeError: Failed to fetch"  # refused, and Cross-Origin-Resource-Policy hides even that
    evil.evaluate(
        """url => { const f = document.createElement('form'); f.method = 'POST'; f.action = url;
                    document.body.append(f); f.submit(); }""",
        kill,
    )
    evil.wait_for_url(kill)
    assert "refused" in evil.inner_text("body")
    assert sandbox.is_running()
    assert sandbox.commands.run("echo still here").stdout == "still here\n"
