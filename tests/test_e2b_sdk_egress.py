"""Egress rules through the real `e2b` SDK against the running server: what its sandboxes reach on the way out.

The only destinations are the test internet of `tests.internet_fixtures` (a namespace this module creates, by
address: the server's sandboxes resolve with the host's DNS) and loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2b import ALL_TRAFFIC, Sandbox

from tests.internet_fixtures import OTHER_IP, WEB_IP, internet  # noqa: F401 (the fixture below)
from tests.server_fixtures import RunningServer, point_e2b_at, server_in_temp_dir

CURL_CANNOT_CONNECT = 7
pytestmark = pytest.mark.usefixtures("internet")


def _created(made: list[Sandbox], **options: Any) -> Sandbox:
    made.append(Sandbox.create(**options))
    return made[-1]


def _reaches(sbx: Sandbox, address: str) -> bool:
    """Whether curl fetches from `address`; a failure must be a refused connection (at once), not a timeout."""
    result = sbx.commands.run(f"curl -sS --max-time 60 http://{address}/; echo exit=$?")
    if result.stdout.endswith(f"exit={CURL_CANNOT_CONNECT}\n"):
        return False
    assert result.stdout == f"hello from {address}\nexit=0\n", result
    return True


def test_a_default_sandbox_reaches_the_internet_with_curl_and_python(sandboxes: list[Sandbox]) -> None:
    sbx = _created(sandboxes)
    assert _reaches(sbx, WEB_IP)
    fetch = f"python -c \"import urllib.request as u; print(u.urlopen('http://{OTHER_IP}/').read().decode())\""
    assert sbx.commands.run(fetch).stdout == f"hello from {OTHER_IP}\n\n"


def test_allow_internet_access_false_is_refused_at_once(sandboxes: list[Sandbox]) -> None:
    assert not _reaches(_created(sandboxes, allow_internet_access=False), WEB_IP)


def test_deny_out_and_allow_out_cidrs_hold_and_survive_pause_and_resume(sandboxes: list[Sandbox]) -> None:
    denied = _created(sandboxes, network={"deny_out": ["203.0.113.16/28"]})
    allowed = _created(sandboxes, network={"allow_out": [f"{OTHER_IP}/32"], "deny_out": [ALL_TRAFFIC]})
    for sbx in (denied, allowed):
        assert not _reaches(sbx, WEB_IP)
        assert _reaches(sbx, OTHER_IP)
    denied.pause()
    resumed = Sandbox.connect(denied.sandbox_id)
    assert not _reaches(resumed, WEB_IP)
    assert _reaches(resumed, OTHER_IP)


def test_update_network_replaces_the_rules_of_a_running_sandbox(sandboxes: list[Sandbox]) -> None:
    sbx = _created(sandboxes)
    assert _reaches(sbx, WEB_IP)
    sbx.update_network({"deny_out": [ALL_TRAFFIC]})
    assert not _reaches(sbx, WEB_IP)
    sbx.update_network({})
    assert _reaches(sbx, WEB_IP)


@pytest.fixture(scope="module")
def offline_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose sandboxes get no internet unless a create asks for it (`serve --sandbox-internet off`)."""
    with server_in_temp_dir(tmp_path_factory, "offline", "--sandbox-internet", "off") as server:
        yield server


def test_a_server_without_internet_by_default_still_gives_it_to_who_asks(
    offline_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_e2b_at(offline_server, monkeypatch)
    made: list[Sandbox] = []
    try:
        quiet, online = _created(made), _created(made, allow_internet_access=True)
        assert quiet.get_info().allow_internet_access is False  # reported as what is in force
        assert not _reaches(quiet, WEB_IP)
        assert _reaches(online, WEB_IP)
    finally:
        for sandbox in made:
            sandbox.kill()
