"""Routing rules of the data plane (e2b-protocol §1.5), as a table from request to verdict."""

from __future__ import annotations

import pytest

from gateway._routing import Route, Router, RoutingError, parse_route

DOMAIN = "sandbox.localhost"
ID, PORT = b"e2b-sandbox-id", b"e2b-sandbox-port"


@pytest.mark.parametrize(
    ("host", "headers", "route"),
    [
        pytest.param("8008-abc123.sandbox.localhost", [], Route("abc123", 8008), id="host-form"),
        pytest.param(b"49983-abc123.sandbox.localhost:3000", [], Route("abc123", 49983), id="host-form-with-port"),
        pytest.param("8008-ABC123.Sandbox.LocalHost", [], Route("abc123", 8008), id="host-is-case-insensitive"),
        pytest.param("127.0.0.1:3000", [(ID, b"abc123"), (PORT, b"49983")], Route("abc123", 49983), id="ipv4"),
        pytest.param("[::1]:3000", [(ID, b"abc123"), (PORT, b"49999")], Route("abc123", 49999), id="ipv6"),
        pytest.param("localhost", [(ID, b"abc123"), (PORT, b"80")], Route("abc123", 80), id="localhost"),
        pytest.param("sandbox.sandbox.localhost", [(ID, b"x1"), (PORT, b"1")], Route("x1", 1), id="sandbox-host"),
        pytest.param("sandbox.localhost", [(ID, b"x1"), (PORT, b"65535")], Route("x1", 65535), id="bare-domain"),
    ],
)
def test_sandbox_requests_route_to_their_port(
    host: str | bytes, headers: list[tuple[bytes, bytes]], route: Route
) -> None:
    assert parse_route(host, headers, DOMAIN) == route


@pytest.mark.parametrize(
    ("host", "headers"),
    [
        pytest.param("127.0.0.1:3000", [], id="ip-without-routing-headers"),
        pytest.param("localhost", [(b"accept", b"*/*")], id="localhost-without-routing-headers"),
        pytest.param("api.example.com", [(ID, b"abc123"), (PORT, b"80")], id="other-host-ignores-headers"),
        pytest.param("8008-abc123.other.domain", [], id="other-domain"),
        pytest.param("api.sandbox.localhost", [], id="api-host-of-the-domain"),
        pytest.param("localhost.sandbox.localhost.evil.com", [], id="domain-not-a-suffix"),
    ],
)
def test_other_requests_belong_to_the_control_plane(host: str, headers: list[tuple[bytes, bytes]]) -> None:
    assert parse_route(host, headers, DOMAIN) is None


@pytest.mark.parametrize(
    ("host", "headers"),
    [
        pytest.param("a.8008-abc123.sandbox.localhost", [], id="two-labels-under-the-domain"),
        pytest.param("abc123.sandbox.localhost", [], id="no-port"),
        pytest.param("http-abc123.sandbox.localhost", [], id="port-not-a-number"),
        pytest.param("0-abc123.sandbox.localhost", [], id="port-zero"),
        pytest.param("8008-abc-123.sandbox.localhost", [], id="id-with-dash"),
        pytest.param("8008-.sandbox.localhost", [], id="empty-id"),
        pytest.param("127.0.0.1", [(ID, b"abc123")], id="id-header-without-port"),
        pytest.param("127.0.0.1", [(PORT, b"80")], id="port-header-without-id"),
        pytest.param("127.0.0.1", [(ID, b"abc123"), (PORT, b"65536")], id="port-out-of-range"),
        pytest.param("127.0.0.1", [(ID, b"ABC123"), (PORT, b"80")], id="id-not-lowercase"),
        pytest.param("127.0.0.1", [(ID, b"abc_123"), (PORT, b"80")], id="id-not-alphanumeric"),
    ],
)
def test_malformed_sandbox_addresses_raise_routing_error(host: str, headers: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(RoutingError) as raised:
        parse_route(host, headers, DOMAIN)
    assert raised.value.status_code == 400


def test_router_rejects_an_empty_domain_at_construction() -> None:
    with pytest.raises(ValueError, match="invalid sandbox domain"):
        Router(".")


def test_router_caches_the_verdict_per_host() -> None:
    router = Router(DOMAIN)
    first = router.parse(b"8008-abc123.sandbox.localhost", [])
    assert router.parse(b"8008-abc123.sandbox.localhost", []) is first
