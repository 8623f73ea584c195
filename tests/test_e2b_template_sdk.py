"""The real E2B Template SDK (`from e2b import Template`) building templates on this server, and sandboxes made
from them. The apt, pip and npm steps reach Debian's archive, PyPI and npm: the registries users install from."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import (
    AsyncTemplate,
    Sandbox,
    Template,
    wait_for_file,
    wait_for_port,
    wait_for_process,
    wait_for_timeout,
    wait_for_url,
)
from e2b.exceptions import BuildException, SandboxException
from prometheus_client.parser import text_string_to_metric_families

from tests.polling import wait_for
from tests.runtime_fixtures import require_criu
from tests.server_fixtures import RunningServer, point_e2b_at, server_in_temp_dir
from tests.ui_fixtures import new_key, sign_in


def _context(root: Path) -> Path:
    app = root / "app"
    (app / "static").mkdir(parents=True)
    (app / "static" / "index.html").write_text("<title>built here</title>\n")
    (app / "greet.py").write_text("print('hello from a copied file')\n")
    return root


def test_a_template_built_with_the_sdk_has_every_step_and_starts_with_its_server_up(
    e2b_env: RunningServer, tmp_path: Path
) -> None:
    marker = f"host-marker-{uuid.uuid4().hex}"
    (Path("/tmp") / marker).write_text("the host's")
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    template = (
        Template(file_context_path=str(_context(tmp_path)))
        .from_template("sandbox-base-node")
        .run_cmd(f"echo build {marker}")  # a step of its own: every layer above is new, so really built
        .apt_install(["jq"])
        .pip_install(["six==1.17.0"])
        .npm_install(["semver@7.6.3"], g=True)
        .copy("app", "/srv/app/")
        .set_envs({"GREETING": "hi there"})
        .run_cmd(f'echo "$GREETING" > /srv/greeting && test ! -e /tmp/{marker} && touch /{marker}', user="root")
        .set_user("worker")
        .set_workdir("/srv/app")
        .run_cmd("id -un > whoami-at-build")
        .set_start_cmd("python3 -m http.server 8000 --directory /srv/app/static", wait_for_port(8000))
    )
    logs: list[str] = []
    try:
        info = Template.build(template, f"{name}:v1", on_build_logs=lambda entry: logs.append(entry.message))
        assert info.template_id
        assert not any(message.startswith("CACHED RUN") for message in logs)
        assert not (Path("/") / marker).exists()  # the RUN wrote the build sandbox's root, not the host's
        assert Template.exists(name)
        assert Template.exists(f"{name}:v1")
        _only_its_key_sees_it(e2b_env, name, marker)

        sbx = Sandbox.create(f"{name}:v1", timeout=120)
        try:
            assert sbx.get_info().template_id == info.template_id
            run = sbx.commands.run(
                "whoami; pwd; cat /srv/greeting whoami-at-build; jq -n 1+1;"
                " python3 -c 'import six; print(six.__version__)'; semver 1.2.3; python3 /srv/app/greet.py;"
                " stat -c %U /srv/app/greet.py; echo $GREETING; curl -fs localhost:8000/index.html"
            )  # fmt: skip
            assert run.stdout.splitlines() == [
                "worker", "/srv/app", "hi there", "worker", "2", "1.17.0", "1.2.3", "hello from a copied file",
                "user", "hi there", "<title>built here</title>",
            ]  # fmt: skip
        finally:
            sbx.kill()

        again: list[str] = []
        Template.build(template, f"{name}:v2", on_build_logs=lambda entry: again.append(entry.message))
        reused = [message for message in again if message.startswith("CACHED")]
        assert len(reused) == 2 + 9  # the base's two layers, then each step but ENV (which makes none)
        assert not [message for message in again if message.startswith("built layer")]
        tags = {tag.tag for tag in Template.get_tags(name)}
        assert tags == {"v1", "v2"}
    finally:
        (Path("/tmp") / marker).unlink()
        httpx.delete(f"{e2b_env.url}/templates/{name}", headers={"X-API-Key": e2b_env.api_key})
    assert not Template.exists(name)


def _only_its_key_sees_it(server: RunningServer, name: str, marker: str) -> None:
    """The template is the building key's: on its Templates page with the build log, unknown to another key."""
    client, _ = sign_in(server, server.api_key)
    try:
        page = client.get("/ui/templates").text
    finally:
        client.close()
    assert name in page
    assert f"[1] build {marker}" in page  # the first step's own output, under its step number
    other = new_key(server, f"other-{name}")
    assert not Template.exists(name, api_key=other)
    with pytest.raises(SandboxException, match=f"404: template '{name}' not found"):
        Sandbox.create(name, api_key=other)


def test_a_failing_step_fails_the_build_at_that_step_with_its_output(e2b_env: RunningServer) -> None:
    template = Template().from_template("base").run_cmd("echo all good").run_cmd("echo broken-step >&2; exit 7")
    with pytest.raises(BuildException, match="exit status 7") as failure:
        Template.build(template, f"fails-{uuid.uuid4().hex[:8]}")
    assert "broken-step" in str(failure.value)


def test_a_base_this_server_cannot_have_fails_at_base_naming_the_bases_that_work(e2b_env: RunningServer) -> None:
    template = Template().from_image("ubuntu:24.04").run_cmd("true")
    with pytest.raises(BuildException, match=r"'ubuntu:24\.04' is not available on this server") as failure:
        Template.build(template, f"ubuntu-{uuid.uuid4().hex[:8]}")
    assert "debian:bookworm" in str(failure.value)


def test_the_async_sdk_builds_with_its_resources_skip_cache_and_a_dockerfile(
    e2b_env: RunningServer, tmp_path: Path
) -> None:
    (tmp_path / "page.txt").write_text("from the dockerfile's context\n")
    dockerfile = (
        "FROM python:3.11\n"
        "RUN echo dockerfile-run > /etc/dockerfile-run\n"
        "ENV COLOUR=blue\n"
        "WORKDIR /site\n"
        "COPY page.txt .\n"
        'CMD ["python3", "-m", "http.server", "8081"]\n'
    )
    template = (
        Template(file_context_path=str(tmp_path)).from_dockerfile(dockerfile)
        .set_ready_cmd(wait_for_url("http://localhost:8081/page.txt"))
    )  # fmt: skip
    name = f"async-{uuid.uuid4().hex[:8]}"

    async def build_twice() -> tuple[list[str], list[str]]:
        first: list[str] = []
        await AsyncTemplate.build(
            template, name, cpu_count=1, memory_mb=512, on_build_logs=lambda e: first.append(e.message)
        )
        forced: list[str] = []
        await AsyncTemplate.build(template, name, skip_cache=True, on_build_logs=lambda e: forced.append(e.message))
        return first, forced

    try:
        first, forced = asyncio.run(build_twice())
        assert any("python:3.11 is a Debian bookworm root" in line for line in first)  # says what it used
        assert not [line for line in forced if line.startswith("CACHED") and "RUN" in line]  # all rebuilt
        sbx = Sandbox.create(name, timeout=60)
        try:
            info = sbx.get_info()
            assert (info.cpu_count, info.memory_mb) == (2, 1024)  # the forced rebuild asked for the defaults
            shown = sbx.commands.run("cat /etc/dockerfile-run; echo $COLOUR; pwd; curl -fs localhost:8081/page.txt")
            assert shown.stdout.splitlines() == ["dockerfile-run", "blue", "/site", "from the dockerfile's context"]
        finally:
            sbx.kill()
    finally:
        httpx.delete(f"{e2b_env.url}/templates/{name}", headers={"X-API-Key": e2b_env.api_key})


# Each start command becomes ready only after a second; the check passes only once it has.
_LATE = "sleep 1 && "


@pytest.mark.parametrize(
    ("ready", "start", "check"),
    [
        (wait_for_file("/tmp/ready"), f"{_LATE}touch /tmp/ready && sleep infinity", "test -f /tmp/ready"),
        (wait_for_process("late-worker"), f"cp /bin/sleep /tmp/late-worker && {_LATE}exec /tmp/late-worker infinity",
         "pgrep -x late-worker"),
        (wait_for_port(8124), f"{_LATE}exec python3 -m http.server 8124", "curl -fs -o /dev/null localhost:8124"),
        (wait_for_url("http://localhost:8125/"), f"{_LATE}exec python3 -m http.server 8125",
         "curl -fs -o /dev/null localhost:8125"),
    ],
)  # fmt: skip
def test_every_ready_helper_is_waited_for(e2b_env: RunningServer, ready: Any, start: str, check: str) -> None:
    name = f"ready-{uuid.uuid4().hex[:8]}"
    template = Template().from_template("base").set_start_cmd(start, ready)
    try:
        Template.build(template, name)
        sbx = Sandbox.create(name, timeout=60)
        try:
            assert sbx.commands.run(check).exit_code == 0  # ready at once: create waited for it
        finally:
            sbx.kill()
    finally:
        httpx.delete(f"{e2b_env.url}/templates/{name}", headers={"X-API-Key": e2b_env.api_key})


def test_a_timed_ready_command_makes_every_create_wait_for_it(e2b_env: RunningServer) -> None:
    name = f"ready-{uuid.uuid4().hex[:8]}"
    try:
        Template.build(Template().from_template("base").set_start_cmd("sleep infinity", wait_for_timeout(2000)), name)
        began = time.monotonic()
        sbx = Sandbox.create(name, timeout=60)
        assert time.monotonic() - began >= 2.0  # `sleep 2`; a lower bound: a loaded machine only makes it longer
        sbx.kill()
    finally:
        httpx.delete(f"{e2b_env.url}/templates/{name}", headers={"X-API-Key": e2b_env.api_key})


@pytest.fixture(scope="module")
def warm_builds_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with server_in_temp_dir(tmp_path_factory, "warm-builds", "--warm-builds", "1") as running:
        yield running


def _pool_figure(server: RunningServer, field: str, template: str) -> float:
    metrics = httpx.get(f"{server.url}/metrics", headers={"X-API-Key": server.api_key}).text
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == f"agent_sandbox_warm_pool_{field}" and sample.labels.get("template") == template:
                return sample.value
    return 0.0


def test_with_warm_builds_a_tagged_build_keeps_a_ready_sandbox_and_a_create_claims_it(
    warm_builds_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_e2b_at(warm_builds_server, monkeypatch)
    name = f"warm-{uuid.uuid4().hex[:8]}"
    template = Template().from_template("base").set_start_cmd("touch /tmp/warm-started && sleep infinity",
                                                              wait_for_file("/tmp/warm-started"))  # fmt: skip
    info = Template.build(template, f"{name}:v1")
    pooled = f"{info.template_id}/{info.build_id}"
    wait_for(lambda: _pool_figure(warm_builds_server, "ready", pooled) == 1, what="the build's warm sandbox")
    sbx = Sandbox.create(f"{name}:v1", timeout=60)
    try:
        assert _pool_figure(warm_builds_server, "claims_total", pooled) == 1
        assert sbx.commands.run("ls /tmp/warm-started").exit_code == 0
    finally:
        sbx.kill()
    httpx.delete(f"{warm_builds_server.url}/templates/{name}", headers={"X-API-Key": warm_builds_server.api_key})
    wait_for(lambda: _pool_figure(warm_builds_server, "target", pooled) == 0, what="the deleted build's pool to go")


def test_what_a_build_cannot_honour_or_read_is_a_400(e2b_env: RunningServer) -> None:
    headers = {"X-API-Key": e2b_env.api_key}
    grown = httpx.post(f"{e2b_env.url}/v3/templates", headers=headers, json={"name": "grow-me", "minFreeDiskMb": 512})
    assert grown.status_code == 400
    assert "minFreeDiskMb is not supported" in grown.json()["message"]
    made = httpx.post(f"{e2b_env.url}/v3/templates", headers=headers, json={"name": f"lv-{uuid.uuid4().hex[:8]}"})
    assert made.status_code == 202
    ids = made.json()
    status = f"{e2b_env.url}/templates/{ids['templateID']}/builds/{ids['buildID']}/status"
    assert httpx.get(status, headers=headers, params={"level": "loud"}).status_code == 400
    assert httpx.get(status, headers=headers, params={"level": "warn"}).json()["status"] == "waiting"
    httpx.delete(f"{e2b_env.url}/templates/{ids['templateID']}", headers=headers)


def _pooled_templates(server: RunningServer) -> set[str]:
    metrics = httpx.get(f"{server.url}/metrics", headers={"X-API-Key": server.api_key}).text
    return {
        sample.labels["template"]
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "agent_sandbox_warm_pool_target" and sample.value > 0
    }


def test_with_warm_builds_a_snapshot_with_memory_keeps_a_ready_copy_and_a_create_claims_it(
    warm_builds_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_criu()
    point_e2b_at(warm_builds_server, monkeypatch)
    source = Sandbox.create()
    before = _pooled_templates(warm_builds_server)
    try:
        source.commands.run("sleep 4242", background=True)
        snapshot = source.create_snapshot(f"warm-mem-{uuid.uuid4().hex[:8]}", mode="full")
        wait_for(lambda: len(_pooled_templates(warm_builds_server) - before) == 1, what="the snapshot's pool")
        [pooled] = _pooled_templates(warm_builds_server) - before
        wait_for(lambda: _pool_figure(warm_builds_server, "ready", pooled) == 1, what="the snapshot's ready copy")
        copy = Sandbox.create(snapshot.snapshot_id)
        try:
            assert _pool_figure(warm_builds_server, "claims_total", pooled) == 1
            assert copy.commands.run("pgrep -fx 'sleep 4242' > /dev/null && echo copied").stdout == "copied\n"
        finally:
            copy.kill()
        assert Sandbox.delete_snapshot(snapshot.snapshot_id)
    finally:
        source.kill()
