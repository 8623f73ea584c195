"""The HTTP/1.1 layer over raw sockets: keep-alive, chunked bodies, pipelining, bad requests."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx

from tests.executor_fixtures import Envd, direct_envd_fixture  # noqa: F401 - fixture


def _connect(envd: Envd) -> socket.socket:
    address = urlsplit(envd.url)
    return socket.create_connection((address.hostname or "", address.port or 80), timeout=10)


def _read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response with a Content-Length (or none): (head, body). Reads no further."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        assert byte, f"connection closed after {head!r}"
        head += byte
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return head.rstrip(b"\r\n"), body


def _token_header(envd: Envd) -> bytes:
    return f"X-Access-Token: {envd.access_token}\r\n".encode()


def test_keep_alive_serves_several_requests_on_one_connection(direct_envd: Envd) -> None:
    with _connect(direct_envd) as sock:
        for _ in range(3):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            head, _ = _read_response(sock)
            assert head.startswith(b"HTTP/1.1 204 ")


def test_pipelined_requests_are_answered_in_order(direct_envd: Envd) -> None:
    request = b"POST /envs HTTP/1.1\r\nHost: x\r\n" + _token_header(direct_envd) + b"Content-Length: 0\r\n\r\n"
    with _connect(direct_envd) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + request.replace(b"POST", b"GET"))
        first, _ = _read_response(sock)
        second, body = _read_response(sock)
    assert first.startswith(b"HTTP/1.1 204 ")
    assert second.startswith(b"HTTP/1.1 200 ")
    assert isinstance(json.loads(body), dict)


def test_chunked_request_bodies_are_read(direct_envd: Envd) -> None:
    body = json.dumps({"path": "/"}).encode()
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:3], body[3:])) + b"0\r\n\r\n"
    request = b"POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with _connect(direct_envd) as sock:
        sock.sendall(request + _token_header(direct_envd) + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        head, response = _read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert json.loads(response)["entry"]["type"] == "FILE_TYPE_DIRECTORY"


def test_expect_100_continue_gets_an_interim_response(direct_envd: Envd) -> None:
    body = b'{"path": "/"}'
    request = b"POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    request += _token_header(direct_envd) + b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _connect(direct_envd) as sock:
        sock.sendall(request)
        assert sock.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        head, _ = _read_response(sock)
    assert head.startswith(b"HTTP/1.1 200 ")


def test_garbage_gets_a_400_and_the_connection_closes(direct_envd: Envd) -> None:
    with _connect(direct_envd) as sock:
        sock.sendall(b"\x16\x03\x01 this is not HTTP\r\n\r\n")
        head, body = _read_response(sock)
        assert sock.recv(1024) == b""
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["code"] == 400


def test_oversized_headers_get_a_431(direct_envd: Envd) -> None:
    with _connect(direct_envd) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        head, _ = _read_response(sock)
    assert head.startswith(b"HTTP/1.1 431 ")


def test_head_health_has_no_body(direct_envd: Envd) -> None:
    with httpx.Client(base_url=direct_envd.url) as client:
        response = client.head("/health")
    assert (response.status_code, response.content) == (204, b"")


def test_unknown_path_is_404_json_and_wrong_method_is_405(direct_envd: Envd) -> None:
    with direct_envd.client() as client:
        missing = client.get("/nope")
        wrong = client.post("/health")
    assert (missing.status_code, missing.json()["code"]) == (404, 404)
    assert wrong.status_code == 405


def test_a_client_vanishing_mid_stream_leaves_the_server_serving(direct_envd: Envd) -> None:
    start = b'{"process":{"cmd":"/bin/bash","args":["-c","sleep 5"]},"stdin":false}'
    body = b"\x00" + len(start).to_bytes(4, "big") + start
    request = b"POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
    request += _token_header(direct_envd) + b"Connect-Timeout-Ms: 5000\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _connect(direct_envd) as sock:
        sock.sendall(request + body)
        assert sock.recv(1024).startswith(b"HTTP/1.1 200 ")
    with httpx.Client(base_url=direct_envd.url) as client:
        assert client.get("/health").status_code == 204
