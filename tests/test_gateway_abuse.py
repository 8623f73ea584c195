"""The gateway survives abuse (audit rows "slowloris" and "fd exhaustion by an outsider"): read timeouts, caps per
client address and in total, and file descriptors kept for the server's own work.

Two real servers. `flood` keeps idle connections (a 600 s head timeout) and caps 50 connections per address; it
starts with a soft fd limit of 4,096 under this process's hard one (20,000 here, as in the audit), so it must
raise its own. `tight` has 3 s head and body timeouts, so a slow client is cut quickly while a long response is
not. Raw sockets from their own loopback addresses
(127.0.0.0/8 all reach the server) stand for the other clients, so the E2B SDK's connections from 127.0.0.1 never
share a cap with them. Nothing asserts how fast: only what happens, with generous deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import resource
import select
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
import trustme
import uvicorn
import websockets.asyncio.client as websockets
from e2b import Sandbox
from uvicorn._types import ASGIReceiveCallable, ASGISendCallable, Scope

from gateway._connection_gate import Admission, ConnectionGate
from gateway._fd_reserve import fd_budget
from gateway._guarded_http import GuardedWebSocketProtocol, guarded_protocol
from gateway._settings import ConnectionLimits
from tests.polling import DEADLINE, wait_for, wait_for_async
from tests.server_fixtures import RunningServer, point_e2b_at, running_server, server_in_temp_dir, wait_for_port
from tests.test_gateway_http_proxy import run, serving_config

FLOOD = 21_000
PER_CLIENT = 50
HARD_FDS = resource.getrlimit(resource.RLIMIT_NOFILE)[1]  # the flood server's hard fd limit, inherited
ENVD = 49983


# --- the gate and the budget, alone ---


class Conn:
    def __init__(self) -> None:
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_a_full_gate_evicts_the_connection_idle_the_longest() -> None:
    gate = ConnectionGate(max_total=3, max_per_client=0)
    old, busy, young, new = Conn(), Conn(), Conn(), Conn()
    for conn in (old, busy, young):
        assert gate.admit(conn, "a") is Admission.SERVE
    gate.busy(busy)
    assert gate.admit(new, "b") is Admission.SERVE
    assert (old.evicted, busy.evicted, young.evicted) == (True, False, False)
    assert gate.open == 3


def test_a_connection_idle_again_after_a_response_goes_to_the_back_of_the_line() -> None:
    gate = ConnectionGate(max_total=2, max_per_client=0)
    first, second = Conn(), Conn()
    gate.admit(first, "a")
    gate.admit(second, "a")
    gate.busy(first)
    gate.idle(first)
    gate.admit(Conn(), "a")
    assert (first.evicted, second.evicted) == (False, True)


def test_a_full_gate_of_busy_connections_drops_the_newcomer() -> None:
    gate = ConnectionGate(max_total=1, max_per_client=0)
    busy = Conn()
    gate.admit(busy, "a")
    gate.busy(busy)
    assert gate.admit(Conn(), "b") is Admission.DROP
    assert gate.open == 1
    assert not busy.evicted


def test_past_its_address_cap_a_connection_is_refused_and_counts_only_in_the_total() -> None:
    gate = ConnectionGate(max_total=10, max_per_client=2)
    served = [Conn(), Conn()]
    for conn in served:
        assert gate.admit(conn, "a") is Admission.SERVE
    refused = Conn()
    assert gate.admit(refused, "a") is Admission.REFUSE
    assert gate.admit(Conn(), "b") is Admission.SERVE
    gate.release(refused)
    assert gate.admit(Conn(), "a") is Admission.REFUSE  # a refusal freed no place of "a"
    gate.release(served[0])
    gate.release(served[0])  # twice: still one place
    assert gate.admit(Conn(), "a") is Admission.SERVE
    assert gate.admit(Conn(), "a") is Admission.REFUSE


def test_refusals_are_logged_once_per_report(caplog: pytest.LogCaptureFixture) -> None:
    gate = ConnectionGate(max_total=1, max_per_client=1)
    busy = Conn()
    gate.admit(busy, "a")
    gate.busy(busy)
    for _ in range(3):
        gate.admit(Conn(), "b")
    gate.report()
    gate.report()
    assert [r.getMessage() for r in caplog.records] == [
        "client connections: 3 dropped (caps: 1 in total, 1 per address; 1 open)"
    ]


def test_the_budget_keeps_the_reserve_and_gives_connections_half_the_rest() -> None:
    assert fd_budget(ConnectionLimits(fd_reserve=1024), 20_000)[1:] == (9488, 9488 // 4)
    assert fd_budget(ConnectionLimits(max_connections_per_client=0), 20_000).max_per_client == 0
    assert fd_budget(ConnectionLimits(max_connections=5000), 20_000).max_total == 5000
    assert fd_budget(ConnectionLimits(max_connections=50_000, fd_reserve=1000), 20_000).max_total == 19_000
    with pytest.raises(ValueError, match="--fd-reserve"):
        fd_budget(ConnectionLimits(fd_reserve=20_000), 20_000)


# --- the protocol in process: where the body timeout must wait for the server ---

SHORT = ConnectionLimits(header_timeout=5, body_timeout=0.5, keep_alive_timeout=1)


async def echo_later(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """Leaves the request unread for four body timeouts (as a hold does), then echoes its body's length; accepts
    a WebSocket and echoes one message."""
    if scope["type"] == "websocket":
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        message = await receive()
        assert message["type"] == "websocket.receive"
        await send({"type": "websocket.send", "text": message.get("text") or ""})
        return
    await asyncio.sleep(4 * SHORT.body_timeout)
    size, more = 0, True
    while more:
        message = await receive()
        assert message["type"] == "http.request"
        size, more = size + len(message["body"]), message["more_body"]
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


@contextlib.asynccontextmanager
async def guarded(limits: ConnectionLimits, gate: ConnectionGate | None = None) -> AsyncIterator[int]:
    """`echo_later` served by a real uvicorn with the gateway's protocols, on a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    protocol = guarded_protocol(limits, gate or ConnectionGate(max_total=100, max_per_client=10))
    config = uvicorn.Config(echo_later, http=protocol, ws=GuardedWebSocketProtocol, log_config=None, lifespan="off")
    async with serving_config(config, sock) as port:
        yield port


async def answer(reader: asyncio.StreamReader) -> bytes:
    """The status and body of the response `echo_later` sends, e.g. b"200 5"."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head)
    assert length is not None
    return head.split(b" ")[1] + b" " + await reader.readexactly(int(length[1]))


def test_a_body_waiting_for_100_continue_is_not_timed_out() -> None:
    async def scenario() -> None:
        async with guarded(SHORT) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(b"hello")
            assert await answer(reader) == b"200 5"
            writer.close()

    run(scenario())


def test_a_large_body_the_server_leaves_unread_is_not_timed_out() -> None:
    async def scenario() -> None:
        async with guarded(SHORT) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = b"x" * (4 << 20)  # past what uvicorn buffers: it stops reading until the app does
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            assert await answer(reader) == b"200 %d" % len(body)
            writer.close()

    run(scenario())


def test_a_closed_websocket_gives_its_place_back() -> None:
    async def scenario() -> None:
        gate = ConnectionGate(max_total=100, max_per_client=1)
        async with guarded(SHORT, gate) as port:
            for i in range(3):  # one place for the address: each WebSocket needs the one before to have given it back
                async with websockets.connect(f"ws://127.0.0.1:{port}/") as websocket:
                    await websocket.send(f"hello {i}")
                    assert await websocket.recv() == f"hello {i}"
                await wait_for_async(lambda: gate.open == 0, what="the WebSocket's place to be given back")

    run(scenario())


# --- real servers ---


@contextlib.contextmanager
def soft_fd_limit(soft: int) -> Iterator[None]:
    """This process's soft RLIMIT_NOFILE set to `soft` for the block (the hard one stays: lowering it is for good)."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, before[1]), before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


@pytest.fixture(scope="module")
def flood(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    flags = ("--header-timeout", "600", "--max-connections-per-client", str(PER_CLIENT))
    with contextlib.ExitStack() as stack:
        with soft_fd_limit(4096):  # the server inherits it; this process gets its own back once it started
            server = stack.enter_context(server_in_temp_dir(tmp_path_factory, "flood", *flags))
        yield server


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    timeouts = ("--header-timeout", "3", "--body-timeout", "3")
    with server_in_temp_dir(tmp_path_factory, "tight", *timeouts) as server:
        yield server


def connect(server: RunningServer, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE, source_address=(source, 0))


def get(sock: socket.socket, extra: str = "", connection: str = "close") -> bytes:
    """Send one GET /health on `sock` and read until the server closes it."""
    sock.sendall(f"GET /health HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: {connection}\r\n\r\n".encode())
    return read_to_end(sock)


def read_to_end(sock: socket.socket, within: float = DEADLINE) -> bytes:
    """Everything the server sends until it closes the connection; fails the test after `within` seconds."""
    deadline = time.monotonic() + within
    data = b""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 1.0)
        if readable:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk
    pytest.fail(f"the server kept the connection open for {within:g} s (got {data[:200]!r})")


def server_fds(server: RunningServer) -> int:
    return len(list(Path(f"/proc/{server.process.pid}/fd").iterdir()))


def server_fd_limits(server: RunningServer) -> tuple[int, int]:
    for line in Path(f"/proc/{server.process.pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no 'Max open files' line")


def test_21000_idle_connections_stop_neither_health_nor_a_create(
    flood: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server_fd_limits(flood) == (HARD_FDS, HARD_FDS)  # the soft limit raised to the hard one
    with idle_connections(flood, FLOOD):
        most_fds = server_fds(flood)
        assert httpx.get(f"{flood.url}/health", timeout=DEADLINE).status_code == 200
        point_e2b_at(flood, monkeypatch)
        sbx = Sandbox.create()
        try:
            assert sbx.commands.run("echo made under a flood").stdout == "made under a flood\n"
        finally:
            sbx.kill()
        most_fds = max(most_fds, server_fds(flood))
        assert served(flood, "127.0.3.9")  # another client, on a fresh connection
    assert most_fds <= HARD_FDS - ConnectionLimits().fd_reserve  # the reserve was never touched
    assert flood.process.poll() is None


# Opens connections `first` to `first + count - 1` of the flood (PER_CLIENT per source address), says so, and
# holds them, sending nothing, until its stdin closes.
HOLDER = """
import resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
port, first, count, per_client = map(int, sys.argv[1:])
def address(i):
    n = i // per_client
    return f"127.1.{n // 250}.{n % 250 + 1}"
held = [socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(address(i), 0))
        for i in range(first, first + count)]
print("held", len(held), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def idle_connections(server: RunningServer, total: int) -> Iterator[None]:
    """`total` idle connections to `server`, held by processes of at most 7,000 each (this one may hold no more than
    its hard fd limit, 20,000 here, and raising that needs a capability root may lack)."""
    per_process = min(7000, HARD_FDS - 256)
    holders = []
    for first in range(0, total, per_process):
        argv = [str(server.port), str(first), str(min(per_process, total - first)), str(PER_CLIENT)]
        holders.append(
            subprocess.Popen(
                [sys.executable, "-c", HOLDER, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        )
    try:
        for holder in holders:
            assert holder.stdout is not None
            assert holder.stdout.readline().startswith("held "), "a holder could not open its connections"
        yield
    finally:
        for holder in holders:
            stop_holder(holder)


def stop_holder(holder: subprocess.Popen[str]) -> None:
    with contextlib.suppress(BrokenPipeError):
        holder.communicate(timeout=DEADLINE)
    if holder.poll() is None:
        holder.kill()
        holder.wait()


def test_past_its_address_cap_a_client_gets_a_503_while_another_address_is_served(flood: RunningServer) -> None:
    full = [connect(flood, "127.0.3.1") for _ in range(PER_CLIENT)]
    try:
        with connect(flood, "127.0.3.1") as over:
            reply = get(over)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"\r\nretry-after: 1" in head.lower()
        assert msgspec.json.decode(body) == {
            "code": 503, "message": f"Too many connections from this address (at most {PER_CLIENT}); retry shortly"
        }  # fmt: skip
        with connect(flood, "127.0.3.1") as over:  # a WebSocket upgrade is refused the same way
            upgrade = (
                "Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            )
            assert get(over, upgrade, connection="Upgrade").startswith(b"HTTP/1.1 503 ")
        with connect(flood, "127.0.3.2") as other:
            assert get(other).startswith(b"HTTP/1.1 200 ")
    finally:
        for sock in full:
            sock.close()
    wait_for(lambda: served(flood, "127.0.3.1"), what="the address's places to come back as its connections close")


def served(server: RunningServer, source: str) -> bool:
    with connect(server, source) as sock:
        return get(sock).startswith(b"HTTP/1.1 200 ")


def test_a_slowloris_connection_is_closed_with_a_408_once_its_head_is_late(tight: RunningServer) -> None:
    with connect(tight, "127.0.4.1") as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        for _ in range(int(DEADLINE)):  # one byte a second: far longer than the 3 s head timeout
            readable, _, _ = select.select([slow], [], [], 1.0)
            if readable:
                break
            with contextlib.suppress(OSError):
                slow.sendall(b"a")
        else:
            pytest.fail("the server kept a trickling request head for a minute")
        assert read_to_end(slow).startswith(b"HTTP/1.1 408 ")
    assert served(tight, "127.0.4.1")


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(tight: RunningServer) -> None:
    with connect(tight, "127.0.4.2") as idle:
        assert read_to_end(idle) == b""


def test_a_stalled_request_body_closes_the_connection(tight: RunningServer) -> None:
    with connect(tight, "127.0.4.3") as stalled:
        stalled.sendall(
            f"POST /sandboxes HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {tight.api_key}\r\n"
            'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"templ'.encode()
        )
        assert read_to_end(stalled) == b""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    """A server on TLS (`--tls-cert`) with a 5 s head timeout, and its CA."""
    tmp = tmp_path_factory.mktemp("abuse-tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "chain.pem"))
    flags = ("--tls-cert", str(tmp / "chain.pem"), "--header-timeout", "5")
    with running_server(tmp / "data", *flags, scheme="https", ca_file=tmp / "ca.pem") as server:
        yield server, tmp / "ca.pem"


def test_a_tls_connection_that_never_says_hello_is_closed_after_the_head_timeout(
    tls: tuple[RunningServer, Path],
) -> None:
    server, ca = tls
    with connect(server, "127.0.4.5") as silent:
        assert read_to_end(silent, within=30) == b""  # asyncio alone would keep it 60 s, uncounted
    verify = ssl.create_default_context(cafile=ca)
    assert httpx.get(f"{server.url}/health", verify=verify, timeout=DEADLINE).status_code == 200


def test_an_idle_keep_alive_connection_is_closed_after_its_response(tight: RunningServer) -> None:
    with connect(tight, "127.0.4.4") as kept:
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert read_to_end(kept).startswith(b"HTTP/1.1 200 ")


SLOW_SERVER = """
import http.server, time
class Slow(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(8)  # the answer starts after every timeout of the server has passed
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(6):  # a streamed answer with 1.5 s between chunks, 9 s in all
            self.wfile.write(b"2\\r\\n%d\\n\\r\\n" % i)
            self.wfile.flush()
            time.sleep(1.5)
        self.wfile.write(b"0\\r\\n\\r\\n")
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Slow).serve_forever()
"""


@pytest.fixture
def slow(tight: RunningServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    point_e2b_at(tight, monkeypatch)
    sbx = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.files.write("/home/user/slow.py", SLOW_SERVER)
        sbx.commands.run("python3 /home/user/slow.py", background=True)
        wait_for_port(sbx, 8000)
        yield sbx
    finally:
        sbx.kill()


def to_sandbox(sbx: Sandbox, port: int) -> dict[str, str]:
    return {"e2b-sandbox-id": sbx.sandbox_id, "e2b-sandbox-port": str(port)}


def test_long_responses_and_streams_outlast_every_timeout(tight: RunningServer, slow: Sandbox) -> None:
    with httpx.Client(base_url=tight.url, timeout=DEADLINE) as client:
        answered = client.post("/echo", content=b"sent at once", headers=to_sandbox(slow, 8000))
        assert (answered.status_code, answered.content) == (200, b"sent at once")
        with client.stream("GET", "/stream", headers=to_sandbox(slow, 8000)) as streamed:
            assert b"".join(streamed.iter_bytes()) == b"".join(b"%d\n" % i for i in range(6))
    counted = slow.commands.run("for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 1; done")  # envd's output stream
    assert counted.stdout.split() == [str(i) for i in range(1, 9)]


def test_a_request_held_while_its_sandbox_wakes_is_answered(tight: RunningServer, slow: Sandbox) -> None:
    assert slow.pause()
    reply = httpx.get(f"{tight.url}/health", headers=to_sandbox(slow, ENVD), timeout=DEADLINE)
    assert reply.status_code in (200, 204)
