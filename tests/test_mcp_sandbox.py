"""Sandbox URLs as the MCP tools report them: `<scheme>://<port>-<id>.<domain>[:<server port>]`."""

from __future__ import annotations

import pytest

from activator import SandboxUrls


@pytest.mark.parametrize(
    ("urls", "expected"),
    [
        (SandboxUrls(domain="sandbox.localhost", port=3000), "http://8008-abc.sandbox.localhost:3000"),
        (SandboxUrls(domain="example.dev", scheme="http", port=80), "http://8008-abc.example.dev"),
        (SandboxUrls(domain="example.dev", scheme="https", port=443), "https://8008-abc.example.dev"),
        (SandboxUrls(domain="example.dev", scheme="https", port=8443), "https://8008-abc.example.dev:8443"),
        (SandboxUrls(domain="example.dev", scheme="https"), "https://8008-abc.example.dev"),
    ],
)
def test_the_server_port_appears_only_when_it_is_not_the_schemes_default(urls: SandboxUrls, expected: str) -> None:
    assert urls.url("abc", 8008) == expected
