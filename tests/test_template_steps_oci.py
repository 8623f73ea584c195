"""How a build request's base becomes a pulled image (`activator._e2b._template_steps`): which images are built
here and which are pulled, where the registry login goes (the plan, for the pull) and where it never goes (the
template, whose layers are its cache keys and which is stored with the build)."""

from __future__ import annotations

import msgspec
import pytest

from activator._e2b._template_steps import BaseRefused, BuildStart, plan_build
from pool import DebootstrapLayer, OciLayer, RegistryLogin, Resources, RunLayer, Template

_BASE = Template(
    name="base", description="", layers=(DebootstrapLayer(),), env={}, start=(), ports=(), user="user",
    workdir="/home/user", resources=Resources(), warm=0, pause_after=None, snapshot_after=None,
)  # fmt: skip


def _plan(body: dict[str, object]) -> tuple[Template, RegistryLogin | None]:
    start = msgspec.convert(body, BuildStart)
    plan = plan_build(start, name="t", build_id="b", resources=Resources(), resolve=lambda _: _BASE)
    return plan.template, plan.registry


def test_an_image_with_a_login_is_pulled_and_the_password_stays_out_of_the_template() -> None:
    template, login = _plan({
        "fromImage": "registry.example/team/app:1",
        "fromImageRegistry": {"type": "registry", "username": "bob", "password": "s3cret-pw"},
        "steps": [{"type": "RUN", "args": ["echo hi"]}],
    })  # fmt: skip
    assert login == RegistryLogin(username="bob", password="s3cret-pw")
    assert "s3cret-pw" not in repr(login)
    assert template.layers[0] == OciLayer(image="registry.example/team/app:1")
    assert isinstance(template.layers[1], RunLayer)  # E2B's user step, in a build sandbox
    assert template.workdir == ""  # for the build to fill in with the image's WorkingDir
    assert b"s3cret-pw" not in msgspec.json.encode(template)


@pytest.mark.parametrize(
    ("image", "pulled"),
    [("debian:bookworm", False), ("python:3.11-slim", False), ("python:3.12-slim", True), ("ubuntu:24.04", True),
     ("127.0.0.1:5000/x/y:z", True)],
)  # fmt: skip
def test_the_usual_images_are_built_here_and_any_other_is_pulled(image: str, pulled: bool) -> None:
    template, login = _plan({"fromImage": image})
    assert isinstance(template.layers[0], OciLayer) is pulled
    assert login is None


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"fromImage": "x:1", "fromImageRegistry": {"type": "aws", "awsAccessKeyId": "a"}}, "type 'aws'"),
        ({"fromImage": "x:1", "fromImageRegistry": {"type": "gcp", "serviceAccountJson": "{}"}}, "type 'gcp'"),
        ({"fromImage": "x:1", "fromImageRegistry": {"type": "registry", "username": "u"}}, "username and password"),
        ({"fromImage": "Not A Reference!"}, r"\[registry/\]repository\[:tag\]"),
    ],
)
def test_cloud_logins_incomplete_logins_and_malformed_references_are_refused_at_base(
    body: dict[str, object], reason: str
) -> None:
    with pytest.raises(BaseRefused, match=reason) as refused:
        _plan(body)
    assert "images from registries this server reaches" in str(refused.value)
