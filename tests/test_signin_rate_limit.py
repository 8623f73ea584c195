"""Failed key checks are limited per client address (`_signin`): past the limit every check from that address
gets 429 + Retry-After (UI sign-in, E2B API, MCP), another address is unaffected, and successful checks never
use the limit up."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from activator import SignInLimiter, TooManySignIns
from tests.server_fixtures import RunningServer, server_in_temp_dir
from tests.test_activator_fakes import Clock
from tests.ui_fixtures import ui_url

WRONG = "e2b_" + "0" * 32
LIMIT = 5


def test_failures_use_the_bucket_up_successes_give_their_token_back_and_it_refills() -> None:
    clock = Clock(0.0)
    limiter = SignInLimiter(60, clock=clock)  # one token a second
    for _ in range(100):  # right keys: each token comes back
        limiter.attempt("a")
        limiter.succeeded("a")
    for _ in range(60):
        limiter.attempt("a")
    with pytest.raises(TooManySignIns) as refused:
        limiter.attempt("a")
    assert refused.value.retry_after == 1
    limiter.attempt("b")  # another address has its own bucket
    clock.advance(1.0)
    limiter.attempt("a")


def test_a_limit_of_zero_is_off() -> None:
    limiter = SignInLimiter(0)
    for _ in range(1000):
        limiter.attempt("a")


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with server_in_temp_dir(tmp_path_factory, "signin", "--signin-failures", str(LIMIT)) as running:
        yield running


def _client(server: RunningServer, address: str) -> httpx.Client:
    """A client whose connections come from `address` (any of 127.0.0.0/8 reaches the loopback server)."""
    base = ui_url(server)
    return httpx.Client(base_url=base, headers={"Origin": base}, transport=httpx.HTTPTransport(local_address=address))


def test_the_ui_sign_in_is_limited_per_address(limited_server: RunningServer) -> None:
    with _client(limited_server, "127.0.0.2") as guesser, _client(limited_server, "127.0.0.3") as owner:
        statuses = [guesser.post("/ui/login", data={"key": WRONG}).status_code for _ in range(LIMIT)]
        assert statuses == [401] * LIMIT
        refused = guesser.post("/ui/login", data={"key": limited_server.api_key})  # the right key, too late
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert "too many failed API-key checks" in refused.text
        assert guesser.get("/v2/sandboxes", headers={"X-API-Key": limited_server.api_key}).status_code == 429
        assert owner.post("/ui/login", data={"key": limited_server.api_key}).status_code == 303


def test_api_and_mcp_checks_are_limited_and_successes_never_count(limited_server: RunningServer) -> None:
    with _client(limited_server, "127.0.0.4") as client:
        for _ in range(3 * LIMIT):  # right keys only: never limited
            assert client.get("/v2/sandboxes", headers={"X-API-Key": limited_server.api_key}).status_code == 200
        assert [client.get("/v2/sandboxes", headers={"X-API-Key": WRONG}).status_code for _ in range(LIMIT)] == [
            401
        ] * LIMIT
        refused = client.get("/v2/sandboxes", headers={"X-API-Key": WRONG})
        assert (refused.status_code, refused.json()["code"]) == (429, 429)
        assert "retry-after" in refused.headers
        mcp = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                          headers={"Authorization": f"Bearer {WRONG}"})  # fmt: skip
        assert (mcp.status_code, "retry-after" in mcp.headers) == (429, True)
