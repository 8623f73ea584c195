"""Benchmark: a port listed in `httpsPorts` (the gateway speaks TLS to it) next to a plain port, same run.

    .venv/bin/python -m loadtests.bench_https_ports [--requests 300] [--mib 16]

One process, on uvloop as the gateway runs: a uvicorn upstream served plain and one served over TLS (a
self-signed certificate), each behind the data plane (`DataPlane`, as `serve` mounts it), with httpx as the
client. Printed, plain next to HTTPS: a small GET over the gateway's kept upstream connection, one on a new
upstream connection each time (the pool emptied first: TCP, or TCP plus the TLS handshake), and a --mib MiB
download; with the ratio of the p50s (HTTPS / plain).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
import uvicorn
import uvloop

from activator import Ingress
from gateway._errors_response import Receive, Scope, Send
from loadtests._stats import percentile, row
from tests.test_gateway_http_proxy import Gateway, running_gateway, serving_config
from tests.test_gateway_traffic_token import SANDBOX, routing
from tests.tls_fixtures import self_signed

_SMALL = b"ok"


def _app(big: bytes) -> Callable[[Scope, Receive, Send], object]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        body = big if scope["path"] == "/big" else _SMALL
        headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


@asynccontextmanager
async def _gateway(app: Callable[..., object], tls_files: tuple[Path, Path] | None) -> AsyncIterator[Gateway]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    tls = {} if tls_files is None else {"ssl_certfile": str(tls_files[0]), "ssl_keyfile": str(tls_files[1])}
    config = uvicorn.Config(app, log_config=None, lifespan="off", access_log=False, **tls)  # type: ignore[arg-type]
    async with serving_config(config, sock) as upstream, running_gateway(upstream) as gw:
        gw.opener.ingresses[SANDBOX] = Ingress(https_ports=(8000,) if tls_files else ())
        yield gw


async def _timed(http: httpx.AsyncClient, gw: Gateway, path: str, runs: int, *, fresh: bool) -> list[float]:
    times = []
    for _ in range(runs):
        if fresh:
            gw.dataplane.pool.drop(SANDBOX)
        began = time.perf_counter()
        response = await http.get(gw.url + path, headers=routing(8000))
        times.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, response.text[:200]
    return times


async def _bench(requests: int, mib: int) -> None:
    big = b"\0" * (mib << 20)
    with tempfile.TemporaryDirectory() as tmp:
        made = self_signed(Path(tmp))
        async with AsyncExitStack() as stack:
            plain = await stack.enter_async_context(_gateway(_app(big), None))
            https = await stack.enter_async_context(_gateway(_app(big), (made.certificate, made.key)))
            http = await stack.enter_async_context(httpx.AsyncClient(trust_env=False, timeout=60))
            cases = (("GET, kept upstream connection", "/", requests, False),
                     ("GET, new upstream connection", "/", requests, True),
                     (f"{mib} MiB download", "/big", max(3, requests // 30), False))  # fmt: skip
            for label, path, runs, fresh in cases:
                await _timed(http, plain, path, 3, fresh=fresh)  # warm-up: imports, the client's connection
                await _timed(http, https, path, 3, fresh=fresh)
                base = await _timed(http, plain, path, runs, fresh=fresh)
                tls = await _timed(http, https, path, runs, fresh=fresh)
                print(row(f"{label}: plain port", base))
                print(row(f"{label}: https port", tls))
                print(f"{'':<44} ratio of p50s {percentile(tls, 50) / percentile(base, 50):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--mib", type=int, default=16)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_bench(args.requests, args.mib))


if __name__ == "__main__":
    main()
