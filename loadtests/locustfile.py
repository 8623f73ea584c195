"""Locust: cold starts and wake-ups through the E2B REST API and the gateway, as many users at once.

Each user loops: create a sandbox (E2B `POST /v2/sandboxes`) -> first request to it through the gateway (the
executor's `GET /health` on port ENVD_PORT, `Host: <ENVD_PORT>-<id>.<domain>`) -> stay idle long enough for the server's
idle policy to freeze and snapshot it -> wake it with the same request -> pause it with E2B's pause -> wake it
by traffic again (created with auto-resume) -> kill it. Locust reports p50 / p95 / p99 per step name:

    create                      E2B create -> sandbox ready (cold start, or a warm-pool claim)
    first request               the first proxied request to the new sandbox
    wake after idle             a request to a sandbox the idle policy froze or snapshotted
    pause                       E2B pause (a snapshot)
    wake after pause            a request to a snapshotted sandbox with auto-resume
    baseline (running)          a request to the same sandbox right after, while it runs

Run it headless against a server started with short idle thresholds (the idle wait here is
`LOCUST_IDLE_SECONDS`, default 3.5 s, which must exceed `--snapshot-after`):

    agent-sandbox serve --port 3000 --pause-after 1 --snapshot-after 2 &
    E2B_API_KEY=$(cat /var/lib/agent-sandbox/api-key) \\
        .venv/bin/locust -f loadtests/locustfile.py --headless -u 10 -r 10 -t 60s --host http://127.0.0.1:3000

`AGENT_SANDBOX_DOMAIN` (default `sandbox.localhost`) must match the server's `--domain`; requests go to
`--host` with the sandbox's Host header, so no wildcard DNS is needed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from locust import HttpUser, between, task

from executor.envd import ENVD_PORT

_API_KEY = os.environ.get("E2B_API_KEY") or os.environ.get("AGENT_SANDBOX_API_KEY", "")
_DOMAIN = os.environ.get("AGENT_SANDBOX_DOMAIN", "sandbox.localhost")
_IDLE_SECONDS = float(os.environ.get("LOCUST_IDLE_SECONDS", "3.5"))
_NEW_SANDBOX = {"templateID": "base", "timeout": 300, "autoPause": True, "autoResume": {"enabled": True}}


class ColdStartUser(HttpUser):
    """One sandbox's whole life per iteration: create, use, idle, wake, pause, wake, kill."""

    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        if not _API_KEY:
            raise RuntimeError("set E2B_API_KEY (or AGENT_SANDBOX_API_KEY) to the server's API key")
        self.api = {"X-API-Key": _API_KEY}  # control-plane calls only: the key never goes to a sandbox

    @task
    def lifecycle(self) -> None:
        with self.client.post(
            "/v2/sandboxes", json=_NEW_SANDBOX, headers=self.api, name="create", catch_response=True
        ) as created:
            if created.status_code != 201:
                created.failure(f"create answered {created.status_code}: {created.text[:200]}")
                return
            sandbox_id = created.json()["sandboxID"]
        try:
            self._probe(sandbox_id, "first request")
            time.sleep(_IDLE_SECONDS)
            self._probe(sandbox_id, "wake after idle")
            pause = f"/sandboxes/{sandbox_id}/pause"
            with self.client.post(pause, json={}, headers=self.api, name="pause", catch_response=True) as paused:
                if paused.status_code != 204:
                    paused.failure(f"pause answered {paused.status_code}")
            self._probe(sandbox_id, "wake after pause")
            self._probe(sandbox_id, "baseline (running)")
        finally:
            self.client.delete(f"/sandboxes/{sandbox_id}", headers=self.api, name="kill")

    def _probe(self, sandbox_id: str, name: str) -> None:
        """GET the executor's /health through the gateway, on a fresh connection."""
        headers: dict[str, Any] = {"Host": f"{ENVD_PORT}-{sandbox_id}.{_DOMAIN}", "Connection": "close"}
        with self.client.get("/health", headers=headers, name=name, catch_response=True) as response:
            if response.status_code != 204:
                response.failure(f"{name}: {response.status_code} {response.text[:200]}")
