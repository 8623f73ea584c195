"""Benchmark: the code interpreter (`code-interpreter-v1`) through `agent-sandbox serve`, real SDK.

Prints, from one run of a fresh server:
- the baseline: `GET /health` of port 49999 through the gateway, same client and path, no kernel involved;
- `run_code("1+1")` on a warm default context, Python and JavaScript (p50 / p99 over --runs), with its
  ratio to the baseline;
- create -> first result: `Sandbox.create()` then `run_code("1+1")`, over --creates sandboxes, from a warm
  pool of --warm sandboxes when `serve` has `--warm` (it says which it measured).

    .venv/bin/python -m loadtests.bench_code --runs 50 --creates 5 [--warm 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from e2b_code_interpreter import Sandbox

from loadtests._stats import percentile, row
from tests.server_fixtures import REPO, RunningServer, running_server
from tests.test_code_interpreter_sdk import ensure_interpreter, interpreter_answers

TEMPLATE = "code-interpreter-v1"


def _ms(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def _health(server: RunningServer, sandbox: Sandbox, runs: int) -> list[float]:
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"}
    times = []
    with httpx.Client(base_url=server.url, headers=headers) as client:
        for _ in range(runs):
            began = time.perf_counter()
            client.get("/health").raise_for_status()
            times.append(_ms(began))
    return times


def _run_code(sandbox: Sandbox, runs: int, language: str) -> list[float]:
    sandbox.run_code("1+1", language=language)  # the default context exists and is warm
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        assert sandbox.run_code("1+1", language=language).text == "2"
        times.append(_ms(began))
    return times


def _create_to_first_result(server: RunningServer, creates: int) -> tuple[list[float], bool]:
    """Times of create + first result; whether the bench had to start the service itself (no start commands)."""
    times, started_by_hand = [], False
    for _ in range(creates):
        began = time.perf_counter()
        sandbox = Sandbox.create()
        try:
            if not interpreter_answers(server, sandbox.sandbox_id):
                started_by_hand = True
                ensure_interpreter(server, sandbox)
            assert sandbox.run_code("1+1").text == "2"
            times.append(_ms(began))
        finally:
            sandbox.kill()
    return times, started_by_hand


def _serve_has_warm() -> bool:
    usage = subprocess.run([sys.executable, "-m", "cli", "serve", "--help"], cwd=REPO, capture_output=True)
    return b"--warm" in usage.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="run_code calls per language (at least 30)")
    parser.add_argument("--creates", type=int, default=5, help="sandboxes created for create -> first result")
    parser.add_argument("--warm", type=int, default=2, help="warm pool size for the template, if serve has --warm")
    args = parser.parse_args()
    warm = args.warm > 0 and _serve_has_warm()
    extra = ["--warm", f"{TEMPLATE}={args.warm}"] if warm else []
    with tempfile.TemporaryDirectory(prefix="bench-code-") as tmp, running_server(Path(tmp) / "data", *extra) as server:
        os.environ.update(server.e2b_env())
        sandbox = Sandbox.create()
        try:
            ensure_interpreter(server, sandbox)
            python = _run_code(sandbox, max(args.runs, 30), "python")
            javascript = _run_code(sandbox, max(args.runs, 30), "javascript")
            health = _health(server, sandbox, max(args.runs, 30))
        finally:
            sandbox.kill()
        if warm:
            time.sleep(5)  # let the pool refill after the sandbox above
        creates, by_hand = _create_to_first_result(server, args.creates)
    baseline = percentile(health, 50)
    print(row("baseline: GET /health of port 49999", health))
    print(row("run_code('1+1') python, warm context", python), f"x{percentile(python, 50) / baseline:.1f}")
    print(row("run_code('1+1') javascript, warm context", javascript), f"x{percentile(javascript, 50) / baseline:.1f}")
    pool = f"warm pool of {args.warm}" if warm else "cold: no warm pool (serve has no --warm)"
    how = "; service started by the bench (no start commands)" if by_hand else ""
    print(row("create -> first result", creates), f"({pool}{how})")


if __name__ == "__main__":
    main()
