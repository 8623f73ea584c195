"""Benchmark: what running envd's file operations with the named user's rights costs (`executor._as_user`).

Starts `agent-sandbox serve`, creates one sandbox and, in interleaved rounds through the real e2b SDK, times a
small read, write and stat as root (BASELINE: done in the executor itself, the way every user's were before)
and as `user` (done by that user's helper process over a socket, its file descriptor passed back). Then the first
call of users that have no helper yet: that one pays for starting it.

    .venv/bin/python -m loadtests.bench_file_rights --runs 200
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from e2b import Sandbox

from loadtests._stats import percentile, row
from tests.server_fixtures import running_server

DATA = os.urandom(1024)


def _ms(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def _rounds(sandbox: Sandbox, runs: int) -> dict[str, list[float]]:
    files = sandbox.files
    for user in ("root", "user"):
        files.write(f"/tmp/bench-{user}", DATA, user=user)
    calls: dict[str, Callable[[str], object]] = {
        "read 1 KiB": lambda user: files.read(f"/tmp/bench-{user}", format="bytes", user=user),
        "write 1 KiB": lambda user: files.write(f"/tmp/bench-{user}", DATA, user=user),
        "stat": lambda user: files.get_info(f"/tmp/bench-{user}", user=user),
    }
    times: dict[str, list[float]] = {f"{name} as {user}": [] for name in calls for user in ("root", "user")}
    for _ in range(runs):
        for name, call in calls.items():
            for user in ("root", "user"):
                began = time.perf_counter()
                call(user)
                times[f"{name} as {user}"].append(_ms(began))
    return times


def _first_calls(sandbox: Sandbox, users: int) -> list[float]:
    times = []
    for index in range(users):
        name = f"bench{index}"
        sandbox.commands.run(f"useradd --create-home {name}", user="root")
        began = time.perf_counter()
        sandbox.files.get_info(f"/home/{name}", user=name)
        times.append(_ms(began))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="rounds of each call and user (at least 30)")
    parser.add_argument("--users", type=int, default=10, help="fresh users whose first call is timed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rights-") as tmp, running_server(Path(tmp) / "data") as server:
        os.environ.update(server.e2b_env())
        sandbox = Sandbox.create()
        try:
            times = _rounds(sandbox, max(args.runs, 30))
            first = _first_calls(sandbox, args.users)
        finally:
            sandbox.kill()
    for name in ("read 1 KiB", "write 1 KiB", "stat"):
        baseline, helper = times[f"{name} as root"], times[f"{name} as user"]
        added = percentile(helper, 50) - percentile(baseline, 50)
        print(row(f"{name} as root (BASELINE)", baseline))
        print(
            row(f"{name} as user", helper), f"x{percentile(helper, 50) / percentile(baseline, 50):.2f} {added:+.2f} ms"
        )
    steady = percentile(times["stat as user"], 50)
    print(row("stat as a user's first call (starts its helper)", first), f"{percentile(first, 50) - steady:+.1f} ms")


if __name__ == "__main__":
    main()
