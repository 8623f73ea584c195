"""Benchmark: a server inside a real sandbox, reached directly and through `agent-sandbox serve`, same run.

    .venv/bin/python -m loadtests.bench_gateway [--duration 5] [--connections 1,10,50]

Starts the server (one uvicorn worker, pinned to CPU 0 when `taskset` exists), creates a sandbox through the
E2B API, runs a tiny keep-alive "OK" server on 127.0.0.1:8008 inside it, then runs wrk (on CPU 1) twice per
concurrency: directly in the sandbox's network namespace (`nsenter --net`), and through the gateway with
`Host: 8008-<id>.sandbox.localhost`. Prints req/s, p50 and p99 for both and the ratio / added p50.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from executor.envd import ENVD_PORT
from loadtests.bench_proxy import DOMAIN, Result, print_table, wrk
from tests.server_fixtures import running_server

_OK_SERVER = """
import asyncio
RESPONSE = b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nContent-Type: text/plain\\r\\n\\r\\nOK"
class OK(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(RESPONSE * data.count(b"\\r\\n\\r\\n"))
async def main():
    server = await asyncio.get_running_loop().create_server(OK, "127.0.0.1", 8008, backlog=1024)
    await server.serve_forever()
asyncio.run(main())
"""


def _create_sandbox_with_server(url: str, key: str) -> str:
    headers = {"X-API-Key": key}
    created = httpx.post(f"{url}/v2/sandboxes", json={"templateID": "base", "timeout": 3600}, headers=headers)
    created.raise_for_status()
    sandbox_id: str = created.json()["sandboxID"]
    token = created.json()["envdAccessToken"]
    envd = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT), "X-Access-Token": token}
    httpx.post(f"{url}/files", params={"path": "/home/user/ok.py"}, files={"file": ("ok.py", _OK_SERVER)},
               headers=envd).raise_for_status()  # fmt: skip
    start = {"process": {"cmd": "/bin/bash", "args": ["-c", "python3 /home/user/ok.py &"]}}
    httpx.post(f"{url}/process.Process/Start", headers={**envd, "Content-Type": "application/connect+json"},
               content=_envelope(start), timeout=30).raise_for_status()  # fmt: skip
    return sandbox_id


def _envelope(message: Mapping[str, object]) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def _wait_for_server(url: str, sandbox_id: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if httpx.get(url, headers={"Host": f"8008-{sandbox_id}.{DOMAIN}"}).status_code == 200:
            return
        time.sleep(0.05)
    raise RuntimeError("the in-sandbox server did not come up")


def bench(args: argparse.Namespace) -> list[tuple[Result, Result]]:
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
    other_cpu = "1" if pin else None
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp, running_server(Path(tmp) / "data") as server:
        if pin:
            subprocess.run(["taskset", "-a", "-p", "-c", "0", str(server.process.pid)], check=True, capture_output=True)
        sandbox_id = _create_sandbox_with_server(server.url, server.api_key)
        _wait_for_server(server.url, sandbox_id)
        pid = (server.data_dir / "sandboxes" / sandbox_id / "pid").read_text().strip()
        host = f"8008-{sandbox_id}.{DOMAIN}"
        wrk(f"{server.url}/", 10, 1, host, other_cpu)  # warm-up: connection pool, route cache
        rows = []
        for connections in args.connections:
            direct = wrk("http://127.0.0.1:8008/", connections, args.duration, None, other_cpu, netns_pid=pid)
            proxied = wrk(f"{server.url}/", connections, args.duration, host, other_cpu)
            rows.append((direct, proxied))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default 5)")
    parser.add_argument("--connections", type=lambda s: [int(c) for c in s.split(",")], default=[1, 10, 50])
    if os.geteuid() != 0:
        sys.exit("run as root: the server creates sandboxes")
    print_table(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
