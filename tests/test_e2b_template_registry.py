"""The real E2B Template SDK building templates on this server from images on real registries (Debian's
docker-registry on loopback, one open, one with htpasswd auth), and sandboxes made from them. The image is a
Debian 12 root in two layers made with umoci: the second deletes a file (a whiteout), `user` is not in it, and
its python3 is in /usr/local/bin only, as in the official python images; its config sets Env and WorkingDir."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from tests.registry_fixtures import Registry, build_layout, debian_root, push, running_registry
from tests.server_fixtures import RunningServer, free_port

_ENV = {"GREETING_FROM_IMAGE": "hello-oci", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


@dataclass(frozen=True)
class Images:
    open: Registry
    locked: Registry
    debian: str  # the Debian image on the open registry
    debian_locked: str  # the same on the registry that demands a login
    bare: str  # an image of one file: no bash, no python3, no glibc


def _first_layer(root: Path) -> None:
    (root / "usr/bin/python3").unlink()
    (root / "usr/local/bin/python3").symlink_to("/usr/bin/python3.11")
    subprocess.run(["userdel", "--root", str(root), "user"], check=True, capture_output=True)
    shutil.rmtree(root / "home/user")
    (root / "srv/hello.txt").write_text("hello from the registry image\n")


def _second_layer(root: Path) -> None:
    (root / "etc/motd").unlink()
    (root / "srv/second.txt").write_text("from the second layer\n")


def _bare(root: Path) -> None:
    (root / "hello").write_text("just a file\n")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    work = tmp_path_factory.mktemp("registries")
    login = ("alice", secrets.token_urlsafe(12))
    with running_registry(work / "open") as open_, running_registry(work / "locked", login) as locked:
        layout = work / "layout"
        debian = build_layout(layout, "debian", debian_root(), [_first_layer, _second_layer], env=_ENV, workdir="/srv")
        bare = build_layout(layout, "bare", None, [_bare], env={}, workdir="")
        yield Images(
            open=open_, locked=locked, debian=push(debian, open_, "oci/debian:12"),
            debian_locked=push(debian, locked, "private/debian:12"), bare=push(bare, open_, "oci/bare:1"),
        )  # fmt: skip


def _delete(server: RunningServer, name: str) -> None:
    httpx.delete(f"{server.url}/templates/{name}", headers={"X-API-Key": server.api_key})


_SHOW = (
    "id -un; id -u; pwd; cat /srv/hello.txt /srv/second.txt; test ! -e /etc/motd && echo motd gone;"
    " echo $GREETING_FROM_IMAGE; readlink -f /usr/bin/python3; cat /home/user/built"
)
_SHOWN = [
    "user", "1000", "/srv", "hello from the registry image", "from the second layer", "motd gone", "hello-oci",
    "/usr/bin/python3.11", "user hello-oci /srv",
]  # fmt: skip


def test_a_template_from_a_registry_image_has_its_content_env_and_workdir_and_runs_as_user(
    e2b_env: RunningServer, images: Images
) -> None:
    name = f"oci-{uuid.uuid4().hex[:8]}"
    template = Template().from_image(images.debian).run_cmd('echo "$(id -un) $GREETING_FROM_IMAGE $PWD" > ~/built')
    logs: list[str] = []
    try:
        Template.build(template, f"{name}:v1", on_build_logs=lambda entry: logs.append(entry.message))
        pinned = [message for message in logs if message.startswith(f"base: {images.debian} is sha256:")]
        assert pinned, logs
        sbx = Sandbox.create(f"{name}:v1", timeout=120)
        try:
            assert sbx.commands.run(_SHOW).stdout.splitlines() == _SHOWN
        finally:
            sbx.kill()

        again: list[str] = []
        Template.build(template, f"{name}:v2", on_build_logs=lambda entry: again.append(entry.message))
        assert pinned[0] in again  # the same digest, so the same layers
        assert any(message.startswith("CACHED image ") for message in again)
        assert not [message for message in again if message.startswith("built layer")]
    finally:
        _delete(e2b_env, name)


def test_a_registry_that_demands_a_login_is_pulled_from_with_it_and_the_password_is_kept_nowhere(
    e2b_env: RunningServer, images: Images
) -> None:
    assert images.locked.login is not None
    username, password = images.locked.login
    name = f"oci-private-{uuid.uuid4().hex[:8]}"
    with pytest.raises(BuildException, match="authentication required") as anonymous:
        Template.build(Template().from_image(images.debian_locked), f"{name}-anon")
    assert f"registry {images.locked.address}" in str(anonymous.value)
    try:
        template = Template().from_image(images.debian_locked, username=username, password=password)
        Template.build(template.run_cmd('echo "$(id -un) $GREETING_FROM_IMAGE $PWD" > ~/built'), f"{name}:v1")
        sbx = Sandbox.create(f"{name}:v1", timeout=120)
        try:
            assert sbx.commands.run(_SHOW).stdout.splitlines() == _SHOWN
        finally:
            sbx.kill()
    finally:
        _delete(e2b_env, name)
    data = e2b_env.data_dir
    kept = [data.parent / f"{data.name}.server.log", *data.rglob("*")]  # its log, records, build logs, layers
    files = [path for path in kept if path.is_file() and not path.is_symlink() and path.stat().st_size < 64 << 20]
    leaks = [str(path) for path in files if password.encode() in path.read_bytes()]
    assert not leaks


def test_an_unreachable_registry_or_an_unknown_image_fails_at_base_naming_the_registry_and_what_works(
    e2b_env: RunningServer, images: Images
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    for image, registry in ((f"{closed}/nothing/here:1", closed), (f"{images.open.address}/no/such:image", None)):
        with pytest.raises(BuildException, match=r"is not available on this server") as failure:
            Template.build(Template().from_image(image).run_cmd("true"), f"oci-missing-{uuid.uuid4().hex[:8]}")
        message = str(failure.value)
        assert f"registry {registry or images.open.address}" in message
        assert "images from registries this server reaches" in message
        assert "debian:bookworm" in message


def test_an_image_without_what_a_sandbox_needs_fails_at_base_saying_what_is_missing(
    e2b_env: RunningServer, images: Images
) -> None:
    with pytest.raises(BuildException, match="cannot be a sandbox's base here: it has no bash") as failure:
        Template.build(Template().from_image(images.bare), f"oci-bare-{uuid.uuid4().hex[:8]}")
    assert "Debian- or Ubuntu-based" in str(failure.value)


def test_cloud_registry_logins_are_refused_at_base(e2b_env: RunningServer) -> None:
    template = Template().from_aws_registry(
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:1", access_key_id="AKIA", secret_access_key="x",
        region="us-east-1",
    )  # fmt: skip
    with pytest.raises(BuildException, match="type 'aws'"):
        Template.build(template, f"oci-aws-{uuid.uuid4().hex[:8]}")
