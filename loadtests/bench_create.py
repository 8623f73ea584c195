"""Benchmark: E2B create → ready, and create + first command, through `agent-sandbox serve`, warm vs cold.

Two servers in one run: one with `--warm base=N`, one without (the baseline: every create is a cold start).
Each round creates a sandbox with `POST /v2/sandboxes` (201 = ready: its executor answered and has the
caller's env vars and token), runs `echo hi` through the gateway (envd `Process/Start`), then kills it and
waits until the pool is full again (`/metrics`), so each figure is one create on an otherwise idle server.

    .venv/bin/python -m loadtests.bench_create --runs 30 [--warm 2]
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import tempfile
import time
from pathlib import Path

import httpx

from executor.envd import ENVD_PORT
from loadtests._stats import row
from tests.server_fixtures import RunningServer, running_server

_START = {"process": {"cmd": "/bin/bash", "args": ["-c", "echo hi"]}, "stdin": False}


def _envelope(message: dict[str, object]) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def _first_command(client: httpx.Client, sandbox_id: str, token: str) -> None:
    headers = {
        "E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT), "X-Access-Token": token,
        "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1",
    }  # fmt: skip
    response = client.post("/process.Process/Start", headers=headers, content=_envelope(_START))
    assert b"aGkK" in response.content, response.content  # base64 of "hi\n"


def _pool_full(client: httpx.Client, target: int) -> bool:
    text = client.get("/metrics").text
    match = re.search(r'warm_pool_ready\{template="base"\} (\d+)', text)
    return match is not None and int(match[1]) >= target


def _rounds(server: RunningServer, runs: int, warm: int) -> tuple[list[float], list[float]]:
    ready, first = [], []
    with httpx.Client(base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=60) as client:
        for _ in range(runs + 1):
            deadline = time.monotonic() + 30
            while warm and not _pool_full(client, warm) and time.monotonic() < deadline:
                time.sleep(0.05)
            began = time.perf_counter()
            created = client.post("/v2/sandboxes", json={"templateID": "base", "envVars": {"A": "1"}})
            created.raise_for_status()
            ready.append((time.perf_counter() - began) * 1000)
            _first_command(client, created.json()["sandboxID"], created.json()["envdAccessToken"])
            first.append((time.perf_counter() - began) * 1000)
            client.delete(f"/sandboxes/{created.json()['sandboxID']}")
    return ready[1:], first[1:]  # the first round warms caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warm", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-create-") as tmp:
        with running_server(Path(tmp) / "cold") as cold:
            cold_ready, cold_first = _rounds(cold, args.runs, 0)
        with running_server(Path(tmp) / "warm", "--warm", f"base={args.warm}") as warm:
            warm_ready, warm_first = _rounds(warm, args.runs, args.warm)
    print(row("baseline: cold create -> ready (201)", cold_ready))
    print(row("baseline: cold create + first command", cold_first))
    print(row(f"warm pool ({args.warm}): create -> ready (201)", warm_ready))
    print(row(f"warm pool ({args.warm}): create + first command", warm_first))


if __name__ == "__main__":
    main()
