"""The UI's routes over a real activator (real store, fake runtime): sign-in, the cookie, CSRF and origin checks,
actions with the activator's own rules, ownership, and errors that never leak a traceback."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from activator import Activator, ApiKeys, SandboxState, SqliteStore
from gateway.ui import SessionStore, UiServices, ui_router
from tests.test_activator_fakes import Clock, FakeRuntime, activator, request

pytestmark = pytest.mark.anyio

ORIGIN = "http://ui.test"
FOREIGN = "http://8000-abcdef.ui.test"  # a sandbox page under the same parent domain


@dataclass
class Ui:
    client: AsyncTestClient[Litestar]
    activator: Activator
    keys: ApiKeys
    sessions: SessionStore
    key: str
    owner: str

    async def sign_in(self, key: str | None = None) -> str:
        """Sign in and return the CSRF token of the session."""
        response = await self.client.post(
            "/ui/login", data={"key": key or self.key, "next": ""}, headers={"Origin": ORIGIN}, follow_redirects=False
        )
        assert response.status_code == 303, response.text
        page = await self.client.get("/ui/sandboxes")
        match = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
        assert match is not None
        return match.group(1)

    async def act(self, path: str, csrf: str | None, origin: str | None = ORIGIN, **kwargs: object) -> httpx.Response:
        headers = {name: value for name, value in (("Origin", origin), ("X-CSRF-Token", csrf)) if value is not None}
        return await self.client.post(path, headers=headers, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
async def ui(tmp_path: Path) -> AsyncIterator[Ui]:
    store = await SqliteStore.open(tmp_path / "state.sqlite")
    keys = ApiKeys(store)
    key_record, raw = await keys.create("laptop")
    the_activator = activator(store, FakeRuntime(), Clock(), domain="ui.test")
    sessions = SessionStore()
    app = Litestar([ui_router(UiServices(activator=the_activator, keys=keys), sessions=sessions)])
    async with AsyncTestClient(app, base_url=ORIGIN) as client:
        yield Ui(client, the_activator, keys, sessions, raw, key_record.id)
    await store.close()


async def test_pages_redirect_to_sign_in_and_back(ui: Ui) -> None:
    response = await ui.client.get("/ui/sandboxes?state=paused", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?next=%2Fui%2Fsandboxes%3Fstate%3Dpaused"
    signed_in = await ui.client.post(
        "/ui/login", data={"key": ui.key, "next": "/ui/sandboxes?state=paused"}, headers={"Origin": ORIGIN},
        follow_redirects=False,
    )  # fmt: skip
    assert signed_in.headers["location"] == "/ui/sandboxes?state=paused"


async def test_the_api_answers_401_json_without_a_session(ui: Ui) -> None:
    response = await ui.client.get("/ui/api/sandboxes/abc/processes")
    assert response.status_code == 401
    assert response.json() == {"error": "sign in first"}


async def test_sign_in_sets_an_opaque_host_only_strict_httponly_cookie(ui: Ui) -> None:
    response = await ui.client.post(
        "/ui/login", data={"key": ui.key}, headers={"Origin": ORIGIN}, follow_redirects=False
    )
    cookie = response.headers["set-cookie"]
    name, _, rest = cookie.partition("=")
    value = rest.split(";")[0]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert name == "agent_sandbox_ui"
    assert ui.key not in cookie
    assert len(value) >= 40
    assert {"httponly", "path", "samesite", "max-age"} <= attributes
    assert "domain" not in attributes  # host-only: never sent to <port>-<id>.<domain>
    assert "samesite=strict" in cookie.lower()
    assert "path=/ui" in cookie.lower()
    page = await ui.client.get("/ui/sandboxes")
    assert ui.key not in page.text


async def test_a_wrong_key_gets_the_form_again_without_the_key(ui: Ui) -> None:
    wrong = "e2b_" + "0" * 32
    response = await ui.client.post("/ui/login", data={"key": wrong}, headers={"Origin": ORIGIN})
    assert response.status_code == 401
    assert "not an API key of this server" in response.text
    assert wrong not in response.text
    assert "set-cookie" not in response.headers


@pytest.mark.parametrize(
    "origin", [None, FOREIGN, "null", "http://ui.test.evil.example"], ids=["none", "sandbox", "null", "lookalike"]
)
async def test_sign_in_from_another_origin_is_refused(ui: Ui, origin: str | None) -> None:
    headers = {"Origin": origin} if origin else {}
    response = await ui.client.post("/ui/login", data={"key": ui.key}, headers=headers, follow_redirects=False)
    assert response.status_code == 403
    assert "set-cookie" not in response.headers


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example", "/\\evil.example", "/elsewhere"])
async def test_sign_in_never_redirects_off_the_ui(ui: Ui, target: str) -> None:
    response = await ui.client.post(
        "/ui/login", data={"key": ui.key, "next": target}, headers={"Origin": ORIGIN}, follow_redirects=False
    )
    assert response.headers["location"] == "/ui/sandboxes"


@pytest.mark.parametrize(
    ("origin", "csrf", "status"),
    [
        (ORIGIN, "right", 200),
        (ORIGIN, None, 403),
        (ORIGIN, "wrong", 403),
        (None, "right", 403),
        (FOREIGN, "right", 403),
    ],
    ids=["same-origin-with-token", "no-token", "wrong-token", "no-origin", "sandbox-origin"],
)
async def test_actions_need_the_ui_origin_and_the_csrf_token(
    ui: Ui, origin: str | None, csrf: str | None, status: int
) -> None:
    token = await ui.sign_in()
    record = await ui.activator.create(ui.owner, request())
    given = token if csrf == "right" else csrf
    response = await ui.act(f"/ui/api/sandboxes/{record.id}/pause", given, origin)
    assert response.status_code == status, response.text
    state = ui.activator.get(ui.owner, record.id).state
    assert state is (SandboxState.SNAPSHOTTED if status == 200 else SandboxState.RUNNING)


async def test_actions_follow_the_activators_rules(ui: Ui) -> None:
    csrf = await ui.sign_in()
    sandbox_id = (await ui.activator.create(ui.owner, request())).id
    base = f"/ui/api/sandboxes/{sandbox_id}"
    assert (await ui.act(f"{base}/pause", csrf)).status_code == 200
    again = await ui.act(f"{base}/pause", csrf)
    assert again.status_code == 409
    assert "already paused" in again.json()["error"]
    assert (await ui.act(f"{base}/resume", csrf)).status_code == 200
    assert ui.activator.get(ui.owner, sandbox_id).state is SandboxState.RUNNING
    assert (await ui.act(f"{base}/timeout", csrf, json={"seconds": 10**9})).status_code == 400
    assert (await ui.act(f"{base}/timeout", csrf, json={"seconds": 3600})).status_code == 200
    assert (await ui.act(f"{base}/kill", csrf)).status_code == 200
    assert (await ui.act(f"{base}/kill", csrf)).status_code == 404


async def test_another_keys_sandbox_is_not_found(ui: Ui) -> None:
    csrf = await ui.sign_in()
    theirs = await ui.activator.create("someone-else", request())
    assert (await ui.client.get(f"/ui/sandboxes/{theirs.id}")).status_code == 404
    assert (await ui.act(f"/ui/api/sandboxes/{theirs.id}/kill", csrf)).status_code == 404
    assert ui.activator.get("someone-else", theirs.id).state is SandboxState.RUNNING


async def test_sign_out_ends_the_session_for_every_copy_of_the_cookie(ui: Ui) -> None:
    csrf = await ui.sign_in()
    cookie = ui.client.cookies.get("agent_sandbox_ui")
    assert cookie is not None
    response = await ui.client.post(
        "/ui/logout", data={"csrf": csrf}, headers={"Origin": ORIGIN}, follow_redirects=False
    )
    assert response.headers["location"] == "/ui/login?signed_out=1"
    ui.client.cookies.set("agent_sandbox_ui", cookie)  # a copy kept from before the sign-out
    replay = await ui.client.get("/ui/api/sandboxes/x/processes")
    assert replay.status_code == 401


async def test_sign_out_from_another_origin_is_refused(ui: Ui) -> None:
    csrf = await ui.sign_in()
    response = await ui.client.post("/ui/logout", data={"csrf": csrf}, headers={"Origin": FOREIGN})
    assert response.status_code == 403
    assert (await ui.client.get("/ui/sandboxes", follow_redirects=False)).status_code == 200


async def test_a_revoked_key_ends_its_sessions_at_the_next_request(ui: Ui) -> None:
    await ui.sign_in()
    await ui.keys.revoke(ui.owner)
    assert (await ui.client.get("/ui/sandboxes", follow_redirects=False)).status_code == 303
    assert await ui.sessions.get(ui.client.cookies.get("agent_sandbox_ui")) is None


@pytest.mark.parametrize(
    ("method", "path", "mode", "status"),
    [
        ("GET", "/ui/sandboxes", "navigate", 200),
        ("GET", "/ui/api/sandboxes/events", "cors", 403),
        ("GET", "/ui/api/sandboxes/x/download?path=a", "navigate", 403),
        ("GET", "/ui/sandboxes", "no-cors", 403),
        ("POST", "/ui/logout", "navigate", 403),
    ],
    ids=["link-to-a-page", "data-fetch", "download", "embedded-page", "form-post"],
)
async def test_requests_another_site_makes_are_refused_except_links_to_pages(
    ui: Ui, method: str, path: str, mode: str, status: int
) -> None:
    await ui.sign_in()
    headers = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": mode, "Origin": FOREIGN}
    response = await ui.client.request(method, path, headers=headers, follow_redirects=False)
    assert response.status_code == status


async def test_responses_forbid_framing_sniffing_and_foreign_scripts(ui: Ui) -> None:
    await ui.sign_in()
    response = await ui.client.get("/ui/sandboxes")
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["cache-control"] == "no-store"


async def test_pages_render_for_a_signed_in_key(ui: Ui) -> None:
    await ui.sign_in()
    record = await ui.activator.create(ui.owner, request(metadata={"team": "<b>ui</b>"}))
    for path in ("/ui", "/ui/sandboxes", "/ui/templates", "/ui/pools", f"/ui/sandboxes/{record.id}"):
        response = await ui.client.get(path)
        assert response.status_code == 200, path
    templates = await ui.client.get("/ui/templates")
    assert "base" in templates.text
    assert "1024 MiB" in templates.text
    assert "No warm pool" in (await ui.client.get("/ui/pools")).text


async def test_an_unexpected_error_is_a_page_without_a_traceback(ui: Ui, monkeypatch: pytest.MonkeyPatch) -> None:
    await ui.sign_in()

    def broken(owner: str, sandbox_id: str) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(ui.activator, "get", broken)
    response = await ui.client.get("/ui/sandboxes/abc")
    assert response.status_code == 500
    assert "secret internals" not in response.text
    assert "Traceback" not in response.text


async def test_a_bad_metadata_filter_is_a_400(ui: Ui) -> None:
    await ui.sign_in()
    response = await ui.client.get("/ui/api/sandboxes/events?metadata=novalue")
    assert response.status_code == 400
    assert "key=value" in response.json()["error"]
    page = await ui.client.get("/ui/sandboxes?metadata=novalue")
    assert page.status_code == 400
    assert "key=value" in page.text


async def test_looking_inside_a_sandbox_paused_by_its_user_asks_to_resume(ui: Ui) -> None:
    csrf = await ui.sign_in()
    sandbox_id = (await ui.activator.create(ui.owner, request())).id
    await ui.act(f"/ui/api/sandboxes/{sandbox_id}/pause", csrf)
    response = await ui.client.get(f"/ui/api/sandboxes/{sandbox_id}/processes")
    assert response.status_code == 409
    assert "resume it" in response.json()["error"]
