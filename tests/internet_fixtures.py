"""A small "internet" inside a network namespace the test creates, so egress tests send nothing off this machine.

The router namespace holds documentation-range addresses (RFC 5737): a web server on 203.0.113.20 (HTTP on
80, HTTPS with a self-signed certificate on 443) and on 198.51.100.20 (HTTP), and a DNS server on 203.0.113.29
that answers `*.egress.test` (`web.` → 203.0.113.20, `other.` → 198.51.100.20). A veth pair joins it to the
host (198.51.100.1 here, .2 there) and one host route sends 203.0.113.16/28 through it; 203.0.113.80, which
the machines' package proxy answers on, stays outside. Everything made is removed afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.polling import wait_for

__all__ = ["DNS_SERVER", "OTHER_IP", "WEB_IP", "Internet", "internet", "made_internet"]

WEB_IP, OTHER_IP, DNS_SERVER = "203.0.113.20", "198.51.100.20", "203.0.113.29"
HOST_SIDE, ROUTER_SIDE, ROUTED = "198.51.100.1", "198.51.100.2", "203.0.113.16/28"

_SERVER = r"""
import socket, ssl, struct, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

NAMES = {b"web": "203.0.113.20", b"other": "198.51.100.20"}

class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from " + self.server.server_address[0].encode() + b"\n"
        if self.path.startswith("/big"):
            body = b"x" * (64 << 20)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

def serve(address, port, tls=False):
    server = ThreadingHTTPServer((address, port), Hello)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[1], sys.argv[2])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()

def dns():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("203.0.113.29", 53))
    while True:
        query, client = sock.recvfrom(512)
        labels, i = [], 12
        while query[i]:
            labels.append(query[i + 1 : i + 1 + query[i]]); i += 1 + query[i]
        question = query[12 : i + 5]
        address = NAMES.get(labels[0].lower()) if labels[1:] == [b"egress", b"test"] else None
        qtype = struct.unpack_from("!H", query, i + 1)[0]
        answers = b""
        if address and qtype == 1:
            answers = struct.pack("!HHHIH4s", 0xC00C, 1, 1, 5, 4, socket.inet_aton(address))
        flags = 0x8180 if address else 0x8183
        sock.sendto(query[:2] + struct.pack("!HHHHH", flags, 1, 1 if answers else 0, 0, 0) + question + answers, client)

serve("203.0.113.20", 80); serve("198.51.100.20", 80); serve("203.0.113.20", 443, tls=True)
print("ready", flush=True)
dns()
"""


class Internet:
    """The running test internet: its namespace's name and the server process inside it."""

    def __init__(self, name: str, server: subprocess.Popen[bytes]) -> None:
        self.name = name
        self.server = server


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def made_internet(work: Path, *, host: Sequence[str] = ()) -> Iterator[Internet]:
    """Build the internet (root only), yield it, and remove the namespace, the veth pair and the route.

    `host`: the prefix that runs a command where the host side goes (`nsenter ...` into the real node's network
    namespace), instead of this host."""
    name, host_link = f"asbnet{os.getpid()}", f"asbh{os.getpid()}"
    on_host = [*host, "ip"]
    cert, key = work / "cert.pem", work / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=web.egress.test",
         "-addext", "subjectAltName=DNS:web.egress.test", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    _ip("netns", "add", name)
    server = None
    try:
        for args in (
            ("link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns", name),
            ("addr", "add", f"{HOST_SIDE}/24", "dev", host_link), ("link", "set", host_link, "up"),
        ):  # fmt: skip
            subprocess.run([*on_host, *args], check=True, capture_output=True)
        inside = ("netns", "exec", name, "ip")
        for args in (
            ("addr", "add", f"{ROUTER_SIDE}/24", "dev", "eth0"), ("addr", "add", f"{OTHER_IP}/24", "dev", "eth0"),
            ("addr", "add", f"{WEB_IP}/32", "dev", "lo"), ("addr", "add", f"{DNS_SERVER}/32", "dev", "lo"),
            ("link", "set", "eth0", "up"), ("link", "set", "lo", "up"), ("route", "add", "default", "via", HOST_SIDE),
        ):  # fmt: skip
            _ip(*inside, *args)
        subprocess.run([*on_host, "route", "add", ROUTED, "via", ROUTER_SIDE, "dev", host_link], check=True)
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", _SERVER, str(cert), str(key)], stdout=subprocess.PIPE
        )
        assert server.stdout is not None
        assert server.stdout.readline() == b"ready\n"
        yield Internet(name, server)
    finally:
        if server is not None:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        subprocess.run([*on_host, "route", "del", ROUTED], capture_output=True)
        subprocess.run([*on_host, "link", "del", host_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        wait_for(lambda: not Path(f"/run/netns/{name}").exists(), what=f"namespace {name} removed")


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    """The test internet, for the tests of one module."""
    with made_internet(tmp_path_factory.mktemp("internet")) as net:
        yield net
