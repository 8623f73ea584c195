"""The Sessions tab on a real server with a real sandbox and the builtin mock agent, driven over HTTP as the page's
script does: start a session from the form, prompt it, see its permission request with its buttons, approve (the
tool runs: its output is in the transcript, the file is in the sandbox) or deny (no file), and an agent's text with
markup shown escaped. The mock runs each prompt line `$ <command>` as a tool call after a permission request.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import httpx
import markupsafe
import pytest
from e2b import Sandbox

from tests.polling import wait_for
from tests.server_fixtures import RunningServer
from tests.ui_fixtures import new_key, sdk_options, sign_in, ui_server_fixture

__all__ = ["ui_server_fixture"]  # a fixture, used by name

WITHIN = 180  # seconds a turn of the mock may take on a loaded machine (generous: no test measures time)


@pytest.fixture(scope="module")
def key(ui_server: RunningServer) -> str:
    return new_key(ui_server, "ui-agent-sessions")


@pytest.fixture(scope="module")
def sandbox(ui_server: RunningServer, key: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(metadata={"suite": "ui-agent-sessions"}, **sdk_options(ui_server, key))
    yield sandbox
    sandbox.kill()


@pytest.fixture
def client(ui_server: RunningServer, key: str) -> Iterator[tuple[httpx.Client, str]]:
    client, csrf = sign_in(ui_server, key)
    try:
        yield client, csrf
    finally:
        client.close()


class Tab:
    """The Sessions tab of one sandbox, as its script uses it."""

    def __init__(self, http: httpx.Client, csrf: str, sandbox_id: str) -> None:
        self.http, self.csrf = http, csrf
        self.base = f"/ui/api/sandboxes/{sandbox_id}/agent-sessions"

    def post(self, path: str, body: dict[str, str], *, csrf: bool = True) -> httpx.Response:
        headers = {"X-CSRF-Token": self.csrf} if csrf else {}
        return self.http.post(self.base + path, json=body, headers=headers, timeout=240)

    def start(self, session_id: str) -> None:
        started = self.post("", {"agent": "mock", "sessionId": session_id})
        assert started.status_code == 200, started.text
        assert started.json() == {"sessionId": session_id}

    def transcript(self, session_id: str) -> str:
        shown = self.http.get(f"{self.base}/{session_id}", timeout=60)
        assert shown.status_code == 200, shown.text
        assert shown.headers["content-type"].startswith("text/html")
        return shown.text

    def wait_for_permission(self, session_id: str) -> tuple[str, str]:
        """The pending permission's id and the transcript that shows its buttons."""

        def pending() -> tuple[str, str] | None:
            text = self.transcript(session_id)
            found = re.search(r'data-reply="once" data-permission="([^"]+)"', text)
            return (found.group(1), text) if found else None

        return wait_for(pending, what=f"a permission request of {session_id}", within=WITHIN)

    def wait_for_turn_end(self, session_id: str, turns: int = 1) -> str:
        def ended() -> str | None:
            text = self.transcript(session_id)
            return text if text.count("turn ended") >= turns and 'data-live="0"' in text else None

        return wait_for(ended, what=f"the end of {session_id}'s turn", within=WITHIN)


def test_the_tab_and_the_start_form_list_the_agents_with_mock_first(
    client: tuple[httpx.Client, str], sandbox: Sandbox
) -> None:
    http, _ = client
    page = http.get(f"/ui/sandboxes/{sandbox.sandbox_id}")
    assert 'data-tab="sessions"' in page.text
    assert 'id="prompt-form"' in page.text
    listed = http.get(f"/ui/api/sandboxes/{sandbox.sandbox_id}/agent-sessions", timeout=60)
    assert listed.status_code == 200, listed.text
    assert re.search(r'<option value="mock" selected\s*>', listed.text), listed.text
    assert 'id="session-create"' in listed.text


def test_a_session_started_from_the_form_runs_a_command_once_approved(
    client: tuple[httpx.Client, str], sandbox: Sandbox
) -> None:
    tab = Tab(*client, sandbox.sandbox_id)
    tab.start("ui-approve")
    assert 'data-open-session="ui-approve"' in tab.http.get(tab.base, timeout=60).text
    sent = tab.post("/ui-approve/messages", {"message": "$ echo hi > /tmp/ui.txt && cat /tmp/ui.txt"})
    assert sent.status_code == 200, sent.text

    permission, shown = tab.wait_for_permission("ui-approve")
    assert "Approve once" in shown
    assert "Deny" in shown
    assert f'data-reply="reject" data-permission="{permission}"' in shown
    busy = tab.post("/ui-approve/messages", {"message": "another"})  # one turn at a time
    assert busy.status_code == 409
    assert "error" in busy.json()

    approved = tab.post(f"/ui-approve/permissions/{permission}", {"reply": "once"})
    assert approved.status_code == 200, approved.text
    done = tab.wait_for_turn_end("ui-approve")
    assert re.search(r'<pre class="code output">hi\s*</pre>', done), done
    assert "data-permission=" not in done  # answered: no buttons any more
    assert '<span class="badge">accept (once)</span>' in done, done
    assert "You" in done
    assert "echo hi &gt; /tmp/ui.txt" in done
    assert sandbox.files.read("/tmp/ui.txt") == "hi\n"


def test_a_denied_command_does_not_run(client: tuple[httpx.Client, str], sandbox: Sandbox) -> None:
    tab = Tab(*client, sandbox.sandbox_id)
    tab.start("ui-deny")
    assert tab.post("/ui-deny/messages", {"message": "$ echo no > /tmp/ui-denied.txt"}).status_code == 200
    permission, _ = tab.wait_for_permission("ui-deny")
    assert tab.post(f"/ui-deny/permissions/{permission}", {"reply": "reject"}).status_code == 200
    done = tab.wait_for_turn_end("ui-deny")
    assert "data-permission=" not in done
    assert not sandbox.files.exists("/tmp/ui-denied.txt")


def test_what_the_agent_writes_is_shown_escaped(client: tuple[httpx.Client, str], sandbox: Sandbox) -> None:
    tab = Tab(*client, sandbox.sandbox_id)
    tab.start("ui-escape")
    markup = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    assert tab.post("/ui-escape/messages", {"message": markup}).status_code == 200
    done = tab.wait_for_turn_end("ui-escape")
    assert str(markupsafe.escape(f"Mock reply to: {markup}")) in done, done
    assert "<script>alert" not in done
    assert "<img src=x" not in done


def test_the_tab_checks_csrf_ownership_and_unknown_sessions(
    ui_server: RunningServer, client: tuple[httpx.Client, str], sandbox: Sandbox
) -> None:
    tab = Tab(*client, sandbox.sandbox_id)
    refused = tab.post("", {"agent": "mock", "sessionId": "ui-no-csrf"}, csrf=False)
    assert refused.status_code == 403
    assert "ui-no-csrf" not in tab.http.get(tab.base, timeout=60).text
    missing = tab.http.get(f"{tab.base}/no-such-session", timeout=60)
    assert missing.status_code == 404
    assert "error" in missing.json()
    assert tab.post("", {"agent": "no-such-agent"}).status_code in (400, 404)
    other, other_csrf = sign_in(ui_server, new_key(ui_server, "ui-agent-sessions-other"))
    with contextlib.closing(other):
        assert other.get(tab.base, timeout=60).status_code == 404  # another key's sandbox
        csrf = {"X-CSRF-Token": other_csrf}
        theirs = other.post(f"{tab.base}/ui-approve/messages", json={"message": "x"}, headers=csrf)
        assert theirs.status_code == 404


def test_the_sessions_page_lists_sessions_across_sandboxes_and_shows_a_killed_ones_transcript(
    ui_server: RunningServer, client: tuple[httpx.Client, str], key: str
) -> None:
    killed = Sandbox.create(metadata={"suite": "ui-agent-sessions"}, **sdk_options(ui_server, key))
    tab = Tab(*client, killed.sandbox_id)
    tab.start("ui-kept")
    markup = "<b>kept</b>"
    assert tab.post("/ui-kept/messages", {"message": markup}).status_code == 200
    tab.wait_for_turn_end("ui-kept")
    killed.kill()

    listing = tab.http.get("/ui/sessions", timeout=60)
    assert listing.status_code == 200, listing.text
    assert f'data-sandbox="{killed.sandbox_id}" data-session="ui-kept"' in listing.text
    assert "sandbox killed" in listing.text
    assert 'aria-current="page">Sessions' in listing.text

    shown = tab.http.get(f"/ui/sessions/{killed.sandbox_id}/ui-kept", timeout=60)
    assert shown.status_code == 200, shown.text
    assert "The sandbox was killed: this copy is read only." in shown.text
    assert str(markupsafe.escape(f"Mock reply to: {markup}")) in shown.text
    assert "<b>kept</b>" not in shown.text
    assert "turn ended" in shown.text
    assert "data-terminate=" not in shown.text  # read only: no controls
    other, _ = sign_in(ui_server, new_key(ui_server, "ui-agent-sessions-kept-other"))
    with contextlib.closing(other):
        assert other.get(f"/ui/sessions/{killed.sandbox_id}/ui-kept", timeout=60).status_code == 404
        assert killed.sandbox_id not in other.get("/ui/sessions", timeout=60).text
