"""The coding-agent server of a real sandbox, reached like any port through the gateway at `2468-<id>.<domain>`.

The executor serves it on its second port (`executor.agent_api.AGENT_PORT`); its Bearer token is the sandbox's envd
access token, which the E2B SDK's create returns (`envdAccessToken`) and which the gateway never checks on its own:
the port is public at the gateway like any other port of a sandbox with public traffic (E2B's default,
`allowPublicTraffic` unset), so the agent server's own check is what answers 401. A sandbox created with
`allowPublicTraffic=false` also wants the `e2b-traffic-access-token` header on this port, as on every port but
envd's (`gateway._traffic`, docs/networking.md "Private ports"): the gateway answers 403 without it, before the
agent server sees the request, and the Bearer token is still checked behind it (the second test).

Traffic wakes a paused sandbox only when it was created with `auto_resume` (E2B's `lifecycle`), so the first test's
sandbox is; the gateway then holds the request while the sandbox resumes (a CRIU restore, or a restart of its
processes over its files) and the session's log, kept on the sandbox's disk, answers with the same events.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import httpx
import pytest
from e2b import Sandbox

from executor.agent_api import AGENT_PORT
from tests.polling import wait_for
from tests.server_fixtures import RunningServer

SESSION = "made-in-a-sandbox"
MADE = "/tmp/agent-made.txt"


def events(client: httpx.Client, headers: dict[str, str], offset: int = 0) -> list[dict[str, Any]]:
    reply = client.get(f"/v1/sessions/{SESSION}/events", params={"offset": offset}, headers=headers)
    assert reply.status_code == 200, reply.text
    page: list[dict[str, Any]] = reply.json()["events"]
    return page


def turns_ended(client: httpx.Client, headers: dict[str, str]) -> int:
    return sum(event["type"] == "turn.ended" for event in events(client, headers))


def tool_outputs(page: list[dict[str, Any]]) -> list[str]:
    """The outputs of the tool calls that completed in `page`, in order."""
    items = [event["data"]["item"] for event in page if event["type"] == "item.completed"]
    return [part["output"] for item in items if item["kind"] == "tool_result" for part in item["content"]]


# "full" keeps the agent server's memory where CRIU works (else it is the same as "filesystem"); "filesystem" drops
# every process, so the woken executor reads the session back from its state directory on the sandbox's disk.
@pytest.mark.parametrize("mode", ["full", "filesystem"])
def test_the_agent_port_runs_a_session_through_the_gateway_and_wakes_its_paused_sandbox(
    e2b_env: RunningServer, mode: Literal["full", "filesystem"]
) -> None:
    sbx = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        token = sbx._envd_access_token  # the `envdAccessToken` of the create's answer
        assert token
        host = sbx.get_host(AGENT_PORT)
        assert host == f"{AGENT_PORT}-{sbx.sandbox_id}.sandbox.localhost"
        auth = {"Authorization": f"Bearer {token}"}
        # *.localhost resolves to loopback; the gateway routes on the Host name
        with httpx.Client(base_url=f"http://{host}:{e2b_env.port}", timeout=60) as client:
            denied = client.get("/v1/health")
            assert denied.status_code == 401, denied.text
            assert client.get("/v1/health", headers={"Authorization": "Bearer not-the-token"}).status_code == 401
            health = client.get("/v1/health", headers=auth)
            assert health.status_code == 200, health.text
            assert health.json() == {"status": "ok"}

            created = client.post(
                f"/v1/sessions/{SESSION}",
                json={"agent": "mock", "permissionMode": "bypass", "directory": "/home/user"},
                headers=auth,
            )
            assert created.status_code == 200, created.text
            assert created.json()["healthy"] is True
            sent = client.post(
                f"/v1/sessions/{SESSION}/messages", json={"message": f"$ echo hi > {MADE}"}, headers=auth
            )
            assert sent.status_code == 204, sent.text
            wait_for(lambda: turns_ended(client, auth) == 1, what="the mock agent's turn to end")
            before = events(client, auth)
            types = [event["type"] for event in before]
            assert "permission.requested" not in types  # bypass: the tool ran without asking
            assert [event["sequence"] for event in before] == list(range(1, len(before) + 1))
            assert sbx.files.read(MADE) == "hi\n"  # the agent's tool really ran inside the sandbox, as its user
            assert sbx.commands.run(f"stat -c %U {MADE}").stdout.strip() == "user"

            assert sbx.pause(mode=mode)
            assert sbx.get_info().state == "paused"
            started = time.monotonic()
            woken = client.get(f"/v1/sessions/{SESSION}/events", headers=auth)  # held while the sandbox resumes
            first_request = time.monotonic() - started
            assert woken.status_code == 200, woken.text
            assert woken.json()["events"] == before
            assert sbx.get_info().state == "running"
            assert client.get("/v1/health").status_code == 401  # the token is back in force after the resume
            print(f"first agent-port request after a {mode} pause: {first_request * 1000:.0f} ms")

            # the session goes on: the next message reaches the agent (restarted if the resume did not keep it)
            again = client.post(f"/v1/sessions/{SESSION}/messages", json={"message": f"$ cat {MADE}"}, headers=auth)
            assert again.status_code == 204, again.text
            wait_for(lambda: turns_ended(client, auth) == 2, what="the second turn to end after the resume")
            after = events(client, auth)
            assert after[: len(before)] == before
            assert tool_outputs(after[len(before) :]) == ["hi\n"]  # `cat` of the file the first turn made
    finally:
        sbx.kill()


def test_private_traffic_wants_the_traffic_token_at_the_gateway_and_the_bearer_token_in_the_sandbox(
    e2b_env: RunningServer,
) -> None:
    sbx = Sandbox.create(network={"allow_public_traffic": False})
    try:
        traffic, bearer = sbx.traffic_access_token, sbx._envd_access_token
        assert traffic
        assert bearer
        assert traffic != bearer
        with httpx.Client(base_url=f"http://{sbx.get_host(AGENT_PORT)}:{e2b_env.port}", timeout=60) as client:
            refused = client.get("/v1/health", headers={"Authorization": f"Bearer {bearer}"})
            assert refused.status_code == 403, refused.text  # the gateway's, in E2B's shape
            assert refused.json()["sandboxId"] == sbx.sandbox_id
            admitted = {"e2b-traffic-access-token": traffic}
            assert client.get("/v1/health", headers=admitted).status_code == 401  # the agent server's own check
            both = client.get("/v1/health", headers={**admitted, "Authorization": f"Bearer {bearer}"})
            assert both.status_code == 200, both.text
    finally:
        sbx.kill()


def test_the_mock_answers_the_clis_agent_list_as_the_sandboxs_user(sbx: Sandbox, e2b_env: RunningServer) -> None:
    """The CLI's `api agents list` call: the mock (run as `user`) reads the catalog the root executor wrote."""
    auth = {"Authorization": f"Bearer {sbx._envd_access_token}", "Accept": "*/*"}
    with httpx.Client(base_url=f"http://{sbx.get_host(AGENT_PORT)}:{e2b_env.port}", timeout=60) as client:
        hello = {"jsonrpc": "2.0", "id": "cli-init", "method": "initialize", "params": {"protocolVersion": "1.0"}}
        assert client.post("/v1/acp/cli-ext?agent=mock", json=hello, headers=auth).status_code == 200
        listing = {"jsonrpc": "2.0", "id": "cli-ext", "method": "_sandboxagent/agent/list", "params": {}}
        answer = client.post("/v1/acp/cli-ext", json=listing, headers=auth)
        assert answer.status_code == 200, answer.text
        agents = {agent["id"]: agent for agent in answer.json()["result"]["agents"]}
        assert agents["mock"]["installed"] is True
        assert {"claude", "codex", "opencode", "pi", "amp", "cursor"} <= set(agents)
        assert client.delete("/v1/acp/cli-ext", headers=auth).status_code == 204
    assert sbx.commands.run("stat -c %a /var/lib/agent-sandbox/agents", user="root").stdout.strip() == "711"
