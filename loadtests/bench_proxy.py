"""Benchmark of the data-plane HTTP proxy: wrk against a backend directly and through the gateway, same run.

    .venv/bin/python loadtests/bench_proxy.py                      # tiny keep-alive backend started here
    .venv/bin/python loadtests/bench_proxy.py --target 10.0.0.5:8008 --opener mypkg.bench:make_opener \
        --route 8008-<sandboxID>

Each process is its own: the backend (a raw asyncio "OK" server on uvloop), the gateway (uvicorn, one worker,
``DataPlane`` in front of an empty control plane) and wrk. When ``taskset`` exists the gateway is pinned to
CPU 0 and the rest to CPU 1, so the gateway's figure is what one core does. ``--opener MODULE:CALLABLE``
names a factory ``(host, port) -> UpstreamOpener`` to use instead of the plain TCP one; ``--route`` is the
``<port>-<sandboxID>`` label wrk puts in its Host header (under ``sandbox.localhost``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import msgspec

if TYPE_CHECKING:
    from activator import Ingress
    from gateway._upstream import UpstreamOpener

DOMAIN = "sandbox.localhost"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nOK"


class Result(msgspec.Struct):
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float


class TcpOpener:
    """Opens plain TCP connections to one address; what a sandbox opener does minus the namespace."""

    def __init__(self, host: str, port: int) -> None:
        self._address = (host, port)

    async def open_upstream(self, sandbox_id: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self._address)
        except BaseException:
            sock.close()
            raise
        return sock

    def touch(self, sandbox_id: str) -> None:
        pass

    async def ingress(self, sandbox_id: str) -> Ingress | None:
        return None  # a public sandbox: nothing to check


class _OkProtocol(asyncio.Protocol):
    """Answers every request head with a 2-byte 200; enough HTTP for a GET-only benchmark."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self._pending = b""

    def data_received(self, data: bytes) -> None:
        data = self._pending + data
        requests = data.count(b"\r\n\r\n")
        self._pending = data[data.rfind(b"\r\n\r\n") + 4 :] if requests else data
        if requests:
            self._transport.write(_RESPONSE * requests)


def run_backend(port: int) -> None:
    import uvloop

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_OkProtocol, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    uvloop.run(serve())


def run_gateway(port: int, target: str, opener_factory: str | None) -> None:
    import uvicorn

    from gateway._dataplane import DataPlane
    from gateway._errors_response import Receive, Scope, Send

    host, target_port = _address(target)
    factory: Callable[[str, int], UpstreamOpener] = TcpOpener if opener_factory is None else _import(opener_factory)

    async def control_plane(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("the benchmark only sends data-plane requests")

    app = DataPlane(control_plane, opener=factory(host, target_port), domain=DOMAIN)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off")


def wrk(
    url: str, connections: int, duration: float, host_header: str | None, cpu: str | None, netns_pid: str | None = None
) -> Result:
    """Run wrk (in the network namespace of `netns_pid`, when given) and read its figures."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency", url]
    if host_header:
        command[1:1] = ["-H", f"Host: {host_header}"]
    if netns_pid:
        command = ["nsenter", f"--net=/proc/{netns_pid}/ns/net", *command]
    output = subprocess.run(_pinned(command, cpu), capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in output or "Socket errors" in output:
        raise RuntimeError(f"wrk saw errors:\n{output}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output)[1])  # type: ignore[index]
    return Result(connections, rps, _latency(output, "50%"), _latency(output, "99%"))


def _latency(output: str, percentile: str) -> float:
    value, unit = re.search(rf"^\s+{percentile}\s+([\d.]+)(us|ms|s)\s*$", output, re.M).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _pinned(command: list[str], cpu: str | None) -> list[str]:
    return ["taskset", "-c", cpu, *command] if cpu is not None else command


@contextmanager
def _process(args: list[str], port: int, cpu: str | None) -> Iterator[None]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([_REPO, os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(_pinned([sys.executable, __file__, *args], cpu), env=env)
    try:
        _wait_listening(port, process)
        yield
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_listening(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _import(path: str) -> Callable[[str, int], UpstreamOpener]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def bench(args: argparse.Namespace) -> list[tuple[Result, Result]]:
    pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2 and not args.no_pin
    gateway_cpu, other_cpu = ("0", "1") if pin else (None, None)
    target, gateway_port = args.target, _free_port()
    with _backend(target, other_cpu) as target:
        gateway_args = ["gateway", str(gateway_port), target, *(["--opener", args.opener] if args.opener else [])]
        with _process(gateway_args, gateway_port, gateway_cpu):
            gateway_url, routed_host = f"http://127.0.0.1:{gateway_port}/", f"{args.route}.{DOMAIN}"
            wrk(gateway_url, 10, 1, routed_host, other_cpu)  # warm-up: pool, caches
            rows = []
            for connections in args.connections:
                direct = wrk(f"http://{target}/", connections, args.duration, None, other_cpu)
                proxied = wrk(gateway_url, connections, args.duration, routed_host, other_cpu)
                rows.append((direct, proxied))
    return rows


@contextmanager
def _backend(target: str | None, cpu: str | None) -> Iterator[str]:
    if target is not None:
        yield target
        return
    port = _free_port()
    with _process(["backend", str(port)], port, cpu):
        yield f"127.0.0.1:{port}"


def print_table(rows: list[tuple[Result, Result]]) -> None:
    print(f"{'conns':>5} | {'direct req/s':>12} {'p50 ms':>7} {'p99 ms':>7} | {'gateway req/s':>13} {'p50 ms':>7}"
          f" {'p99 ms':>7} | {'ratio':>5} {'+p50 ms':>7}")  # fmt: skip
    for direct, proxied in rows:
        print(
            f"{direct.connections:>5} | {direct.rps:>12,.0f} {direct.p50_ms:>7.3f} {direct.p99_ms:>7.2f} |"
            f" {proxied.rps:>13,.0f} {proxied.p50_ms:>7.3f} {proxied.p99_ms:>7.2f} |"
            f" {proxied.rps / direct.rps:>5.2f} {proxied.p50_ms - direct.p50_ms:>7.3f}"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "backend":
        run_backend(int(sys.argv[2]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "gateway":
        opener = sys.argv[5] if len(sys.argv) > 5 else None
        run_gateway(int(sys.argv[2]), sys.argv[3], opener)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run (default 5)")
    parser.add_argument("--connections", type=lambda s: [int(c) for c in s.split(",")], default=[1, 10, 50])
    parser.add_argument("--target", help="HOST:PORT of an HTTP server to proxy to instead of the built-in backend")
    parser.add_argument("--opener", help="MODULE:CALLABLE, a (host, port) -> UpstreamOpener factory")
    parser.add_argument("--route", default="8008-abc123", help="<port>-<sandboxID> to address (default %(default)s)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    print_table(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
