"""Benchmark: what the agent server adds to a coding agent's session and turn, against the same agent run directly.

Starts an executor with its agent server on this host (`tests.agent_fixtures.run_agent_server`) and, for each
agent asked for, runs rounds of:

    direct: session ready      the agent's own ACP process over stdio: spawn, `initialize`, `session/new` and the
                               mode that lets its tool run (BASELINE)
    api: create -> 200         `POST /v1/sessions/{id}` (the agent started, `session.started` logged)
    direct: first delta        `session/prompt` -> the first message or thought chunk on stdout (BASELINE)
    api: first delta           `POST /v1/sessions/{id}/messages/stream` -> the first `item.delta` frame
    direct: turn               `session/prompt` -> its response (BASELINE)
    api: turn                  the same stream -> `turn.ended`

`mock` is the builtin agent (its prompt `$ true` runs one tool call). `claude` is claude-agent-acp installed from
npm (`POST /v1/agents/claude/install`, needs npm and the registry) into a cache directory, driven against the
scripted model server on loopback, whose turn calls Bash once and answers. The goal is at most 10 ms added to
the first delta and 50 ms to a turn; both are printed as p50 differences.

    .venv/bin/python -m loadtests.bench_agents --runs 20 [--agent mock --agent claude]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from executor._agents._catalog import AGENTS, QUIET_ENV, resolve, search_path
from loadtests._stats import percentile, row
from tests.agent_fixtures import node_bin, read_sse, run_agent_server
from tests.scripted_model import ScriptedModel

AGENTS_CACHE = Path("/var/cache/agent-sandbox/bench-agents")
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
BYPASS = {"mock": "bypass", "claude": "bypassPermissions"}
PROMPT = {"mock": "$ true", "claude": "write the file"}
Series = dict[str, list[float]]


class StdioAgent:
    """An ACP agent process driven over its stdin and stdout, newline-delimited JSON-RPC."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self._process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd
        )
        self._next = 0

    def call(self, method: str, params: dict[str, Any], until: Callable[[dict[str, Any]], bool] | None = None) -> float:
        """Send a request; return the ms until `until` holds for a message (default: the response)."""
        self._next += 1
        request_id = self._next
        began = time.perf_counter()
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode() + b"\n"
        )
        self._process.stdin.flush()
        first: float | None = None
        while True:
            line = self._process.stdout.readline()
            if not line:
                raise RuntimeError(f"the agent exited during {method}")
            message = json.loads(line)
            if first is None and until is not None and until(message):
                first = (time.perf_counter() - began) * 1000
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                self.result = message.get("result") or {}
                return first if first is not None else (time.perf_counter() - began) * 1000

    def close(self) -> None:
        self._process.kill()
        self._process.wait()


def _is_chunk(message: dict[str, Any]) -> bool:
    update = (message.get("params") or {}).get("update") or {}
    return update.get("sessionUpdate") in ("agent_message_chunk", "agent_thought_chunk")


def _direct_round(agent: str, argv: list[str], env: dict[str, str], work: str, series: Series) -> None:
    began = time.perf_counter()
    process = StdioAgent(argv, env, work)
    try:
        process.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        process.call("session/new", {"cwd": work, "mcpServers": []})
        session_id = process.result["sessionId"]
        process.call("session/set_mode", {"sessionId": session_id, "modeId": BYPASS[agent]})
        series["direct: session ready"].append((time.perf_counter() - began) * 1000)
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": PROMPT[agent]}]}
        began = time.perf_counter()
        series["direct: first delta"].append(process.call("session/prompt", prompt, until=_is_chunk))
        series["direct: turn"].append((time.perf_counter() - began) * 1000)
    finally:
        process.close()


def _api_round(agent: str, client: httpx.Client, env: dict[str, str], work: str, series: Series) -> None:
    session_id = f"bench-{uuid.uuid4().hex[:8]}"
    body = {"agent": agent, "directory": work, "permissionMode": BYPASS[agent], "env": env}
    began = time.perf_counter()
    created = client.post(f"/v1/sessions/{session_id}", json=body)
    created.raise_for_status()
    series["api: create -> 200"].append((time.perf_counter() - began) * 1000)
    began = time.perf_counter()
    first: list[float] = []

    def turn_over(frame: Any) -> bool:
        if not first and frame.data["type"] == "item.delta":
            first.append((time.perf_counter() - began) * 1000)
        return bool(frame.data["type"] == "turn.ended")

    frames = read_sse(
        client,
        "POST",
        f"/v1/sessions/{session_id}/messages/stream",
        until=turn_over,
        timeout=120,
        json={"message": PROMPT[agent]},
    )
    series["api: turn"].append((time.perf_counter() - began) * 1000)
    assert frames[-1].data["data"]["phase"] == "completed", frames[-3:]
    series["api: first delta"].append(first[0])
    client.post(f"/v1/sessions/{session_id}/terminate").raise_for_status()


def _bench(agent: str, runs: int, scratch: Path) -> list[str]:
    path = f"{node_bin(scratch / f'bin-{agent}')}:{SYSTEM_PATH}"
    trust = {name: os.environ[name] for name in ("NODE_EXTRA_CA_CERTS",) if name in os.environ}
    work = scratch / f"work-{agent}"
    work.mkdir()
    names = ("direct: session ready", "api: create -> 200", "direct: first delta", "api: first delta")
    series: Series = {name: [] for name in (*names, "direct: turn", "api: turn")}
    with ScriptedModel() as model, run_agent_server(agents_dir=AGENTS_CACHE, path=path, env_vars=trust) as server:
        env = {"ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-ant-scripted-bench", "PATH": path}
        with server.client() as client:
            client.timeout = httpx.Timeout(900)
            client.post(f"/v1/agents/{agent}/install", json={}).raise_for_status()
            argv = resolve(AGENTS[agent], search_path(str(AGENTS_CACHE), path, agent))
            assert argv is not None
            direct_env = os.environ | QUIET_ENV | env | trust | {"IS_SANDBOX": "1", "HOME": str(scratch)}
            for index in range(runs + 1):  # the first round warms caches and is not counted
                kept: Series = {name: [] for name in series}
                _direct_round(agent, argv, direct_env, str(work), kept)
                _api_round(agent, client, env, str(work), kept)
                if index:
                    for name, values in kept.items():
                        series[name] += values
    lines = [row(f"{agent}: {name}", values) for name, values in series.items()]
    for what, goal in (("first delta", 10), ("turn", 50)):
        added = percentile(series[f"api: {what}"], 50) - percentile(series[f"direct: {what}"], 50)
        lines.append(f"{agent}: added to the {what}, p50: {added:+.1f} ms (goal <= {goal} ms)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--agent", action="append", choices=("mock", "claude"), help="default: mock")
    args = parser.parse_args()
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as scratch:
        for agent in args.agent or ["mock"]:
            lines += _bench(agent, args.runs, Path(scratch))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
