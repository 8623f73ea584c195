"""Create bodies become create requests with each API generation's defaults."""

from __future__ import annotations

import msgspec
import pytest

from activator import Lifecycle
from activator._e2b._convert import create_request
from activator._e2b._wire import NewSandbox


def body(**fields: object) -> NewSandbox:
    return msgspec.convert({"templateID": "base", **fields}, NewSandbox)


def test_v2_defaults_to_300_s_and_secured() -> None:
    request = create_request(body(), default_timeout=300, default_secure=True)
    assert (request.timeout, request.secure, request.lifecycle) == (300, True, Lifecycle())


def test_v1_honours_secure_and_defaults_to_unsecured() -> None:
    assert not create_request(body(), default_timeout=15, default_secure=False).secure
    assert create_request(body(secure=True), default_timeout=15, default_secure=False).secure


@pytest.mark.parametrize(
    ("fields", "lifecycle"),
    [
        ({"autoPause": True}, Lifecycle(on_timeout="pause")),
        ({"autoPause": True, "autoResume": {"enabled": True}}, Lifecycle(on_timeout="pause", auto_resume=True)),
        ({"lifecycle": {"onTimeout": "pause", "autoResume": True}}, Lifecycle(on_timeout="pause", auto_resume=True)),
        ({"autoPause": True, "lifecycle": {"onTimeout": "kill"}}, Lifecycle(on_timeout="kill")),
    ],
)
def test_auto_pause_and_resume_become_the_lifecycle(fields: dict[str, object], lifecycle: Lifecycle) -> None:
    assert create_request(body(**fields), default_timeout=300, default_secure=True).lifecycle == lifecycle


def test_the_rest_is_carried_over() -> None:
    request = create_request(
        body(
            timeout=60, metadata={"a": "b"}, envVars={"X": "1"}, allow_internet_access=False, network={"allowOut": []}
        ),
        default_timeout=300,
        default_secure=True,
    )
    assert (request.template, request.timeout, request.metadata, request.env_vars) == (
        "base",
        60,
        {"a": "b"},
        {"X": "1"},
    )
    assert request.allow_internet_access is False
