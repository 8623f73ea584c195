"""The `coding-agents` template: the agent server's agents installed, and each one's real turns in a real sandbox.

The scripted model server runs in the test internet (`tests.internet_fixtures`, a namespace this module creates,
at a documentation-range address), so the agent inside the sandbox reaches it the way it would reach a model API:
through the sandbox's egress, not a path only tests have.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox

from executor._agents._catalog import AGENTS
from executor.agent_api import AGENT_PORT
from tests.agent_configs import API_KEY, SESSION_ENV, TURNS, config_files
from tests.internet_fixtures import WEB_IP, Internet, internet  # noqa: F401 (the fixture below)
from tests.polling import wait_for
from tests.server_fixtures import RunningServer

TEMPLATE = Path(__file__).parent.parent / "templates" / "coding-agents.toml"
MODEL_PORT = 8080
MODEL = f"http://{WEB_IP}:{MODEL_PORT}"


def test_the_template_installs_the_catalogs_pinned_packages_where_the_catalog_looks() -> None:
    script = "\n".join(layer.get("script", "") for layer in tomllib.loads(TEMPLATE.read_text())["layers"])
    installed = {match[0]: tuple(match[1].split()) for match in re.findall(r"^install (\w+) (.+)$", script, re.M)}
    expected = {kind.id: kind.packages for kind in AGENTS.values() if kind.packages}
    assert installed == expected
    assert 'npm install --global --prefix "/opt/agents/$agent"' in script  # the catalog's AGENTS_DIR layout


@pytest.fixture(scope="module")
def model(internet: Internet) -> Iterator[str]:  # noqa: F811 (the fixture imported above)
    """The scripted model server inside the test internet."""
    script = Path(__file__).parent / "scripted_model.py"
    argv = ["ip", "netns", "exec", internet.name, sys.executable, str(script), "--host", WEB_IP]
    server = subprocess.Popen([*argv, "--port", str(MODEL_PORT)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith("listening")
        yield MODEL
    finally:
        server.terminate()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


@pytest.fixture
def sbx(e2b_env: RunningServer) -> Iterator[Sandbox]:
    sandbox = Sandbox.create("coding-agents")
    yield sandbox
    sandbox.kill()


def _agent_port(sbx: Sandbox, server: RunningServer) -> httpx.Client:
    token = sbx._envd_access_token
    headers = {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=f"http://{sbx.get_host(AGENT_PORT)}:{server.port}", headers=headers, timeout=120)


def _events(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    page = client.get(f"/v1/sessions/{session_id}/events", params={"limit": 10_000})
    assert page.status_code == 200, page.text
    events: list[dict[str, Any]] = page.json()["events"]
    return events


def _wait(client: httpx.Client, session_id: str, kind: str) -> list[dict[str, Any]]:
    def seen() -> list[dict[str, Any]] | None:
        events = _events(client, session_id)
        return events if any(event["type"] == kind for event in events) else None

    return wait_for(seen, what=f"{kind} in {session_id}", within=240)


def test_every_agent_is_installed_on_node_24(sbx: Sandbox, e2b_env: RunningServer) -> None:
    with _agent_port(sbx, e2b_env) as client:
        agents = {agent["id"]: agent for agent in client.get("/v1/agents").json()["agents"]}
    for agent in ("claude", "codex", "opencode", "pi"):
        assert agents[agent]["installed"] is True, agents[agent]
        assert agents[agent]["path"].startswith(f"/opt/agents/{agent}/bin/")
    assert sbx.commands.run("node --version").stdout.startswith("v24.")


@pytest.mark.parametrize("agent", list(TURNS))
def test_each_agent_runs_a_turn_through_the_sandboxs_egress_approved_then_refused(
    sbx: Sandbox, e2b_env: RunningServer, model: str, agent: str
) -> None:
    """The agent's config in the sandbox user's HOME (as a template or the user would put it), the model's key in
    the session's env; a permission approved in one session (the file written) and refused in another (not)."""
    for relative, text in config_files(agent, model).items():
        sbx.files.write(f"/home/user/{relative}", text)
    turn = TURNS[agent]
    env = SESSION_ENV | {"ANTHROPIC_BASE_URL": model}
    with _agent_port(sbx, e2b_env) as client:
        for session_id, reply in (("approved", "once"), ("refused", "reject")):
            work = f"/home/user/{session_id}"
            sbx.files.make_dir(work)
            body = {"agent": agent, "directory": work, "env": env} | turn.session
            created = client.post(f"/v1/sessions/{session_id}", json=body)
            assert created.status_code == 200, created.text
            sent = client.post(f"/v1/sessions/{session_id}/messages", json={"message": turn.prompt})
            assert sent.status_code == 204
            events = _wait(client, session_id, "permission.requested")
            asked = next(event for event in events if event["type"] == "permission.requested")
            permission = asked["data"]["permission_id"]
            answered = client.post(f"/v1/sessions/{session_id}/permissions/{permission}/reply", json={"reply": reply})
            assert answered.status_code == 204
            events = _wait(client, session_id, "turn.ended")
            assert events[0]["type"] == "session.started"
            phase = "completed" if reply == "once" else turn.refused_phase
            assert [event for event in events if event["type"] == "turn.ended"][-1]["data"]["phase"] == phase
            made = sbx.commands.run(f"cat {work}/hello.txt 2>/dev/null || echo absent").stdout
            assert made == ("hello from scripted model\n" if reply == "once" else "absent\n")
    secrets = sbx.commands.run(f"grep -rl {API_KEY} /var/lib/agent-sandbox/agents || true", user="root")
    kept = [f"/var/lib/agent-sandbox/agents/sessions/{name}/env.json" for name in ("approved", "refused")]
    assert sorted(secrets.stdout.split()) == kept  # the key is in the sessions' env files only, not in a log
