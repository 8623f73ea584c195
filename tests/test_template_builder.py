"""The local runtime's template builder: sandboxed layers built in build sandboxes, cached, and started once."""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pool import LocalRuntime, Template, load_templates
from pool._errors import TemplateBuildFailed
from pool._executor_client import run_command
from pool._templates import CopyLayer, Layer, RunLayer
from tests.runtime_fixtures import IMAGE_CACHE, TEMPLATES, http_get, local_runtime, spec
from tests.test_template_context import templates_with_copy

pytestmark = pytest.mark.anyio

HASH = "ab" * 32
NO_FILES: dict[str, Path] = {}


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    async with local_runtime(tmp_path / "data") as rt:
        yield rt


def _archive() -> bytes:
    """A tar as the E2B SDK uploads it: a directory `app` with a file, named relative to the context."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        directory = tarfile.TarInfo("app")
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(directory)
        content = b"print('hello from the template')\n"
        member = tarfile.TarInfo("app/main.py")
        member.size, member.mode = len(content), 0o600
        tar.addfile(member, io.BytesIO(content))
    return buffer.getvalue()


def _template(layers: list[Layer], **changes: object) -> Template:
    base = TEMPLATES["base"]
    return msgspec.structs.replace(base, name="built", layers=(*base.layers, *layers), **changes)


def _forget_layers(runtime: LocalRuntime, template: Template) -> None:
    """The test's own layers leave the shared image cache (the base's stay)."""
    for key, layer in runtime.images.plan(template)[len(TEMPLATES["base"].layers) : -1]:
        assert layer is not None
        shutil.rmtree(IMAGE_CACHE / "layers" / key, ignore_errors=True)


async def _run(runtime: LocalRuntime, sandbox_id: str, command: str) -> str:
    out = bytearray()
    end = await run_command(
        await runtime.open_socket(sandbox_id, 49983), command, lambda d: out.extend(d.stdout or d.stderr or b""),
        user="root", token=None,
    )  # fmt: skip
    assert end.exit_code == 0, out
    return out.decode()


async def test_run_and_copy_layers_are_built_in_sandboxes_cached_and_seen_by_sandboxes(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    nonce = uuid.uuid4().hex
    archive = tmp_path / "files.tar.gz"
    archive.write_bytes(_archive())
    layers: list[Layer] = [
        RunLayer(script="useradd -m -s /bin/bash app && echo made > /etc/made-by-build", rebuild=nonce),
        CopyLayer(files=HASH, source="app", dest="/srv/app/", user="app", mode="0644", rebuild=nonce),
        RunLayer(script="id -un > whoami && cat /srv/app/main.py", user="app", workdir="/srv/app", env={"A": "1"}),
        RunLayer(script="touch /tmp/scratch /host-marker-$A", env={"A": nonce}),
    ]
    template = _template(layers, start=("cd /srv/app && exec python3 -m http.server 8000",), user="app",
                         ready="curl -fs localhost:8000/main.py")  # fmt: skip
    lines: list[tuple[int | None, str]] = []
    try:
        await runtime.build_template(
            template, lambda layer, _level, line: lines.append((layer, line)), files={HASH: archive}.__getitem__,
            within=600,
        )  # fmt: skip
        first = len(TEMPLATES["base"].layers)
        assert (first + 2, "print('hello from the template')") in lines  # a step's output, under its layer
        assert not list(Path("/").glob(f"host-marker-{nonce}"))  # the build wrote its own root, not the host's
        assert runtime.images.is_built(template)

        again: list[str] = []
        log_again = lambda _layer, _level, line: again.append(line)  # noqa: E731
        await runtime.build_template(template, log_again, files=NO_FILES.__getitem__, within=600)
        assert sum(line.startswith("CACHED") for line in again) == len(template.layers)

        await runtime.start(spec("frombuild1", template))
        assert await http_get(runtime, "frombuild1", 8000, "/main.py") == b"print('hello from the template')\n"
        listing = await _run(
            runtime,
            "frombuild1",
            "stat -c '%U %a' /srv/app/main.py /srv/app/whoami; cat /etc/made-by-build; ls -A /tmp;"
            " cat /etc/resolv.conf",
        )
        owner_main, owner_whoami, made, *rest = listing.splitlines()
        assert (owner_main, owner_whoami, made) == ("app 644", "app 644", "made")
        assert "scratch" not in rest  # /tmp is cleaned before the layer is taken
        assert any(line.startswith("nameserver") for line in rest)  # this sandbox's own resolver, not the build's
    finally:
        await runtime.stop("frombuild1")
        _forget_layers(runtime, template)


async def test_a_failing_step_names_its_layer_with_its_output(runtime: LocalRuntime) -> None:
    template = _template([RunLayer(script="echo about to fail >&2; exit 3", rebuild=uuid.uuid4().hex)])
    with pytest.raises(TemplateBuildFailed) as failure:
        await runtime.build_template(template, lambda *_: None, files=NO_FILES.__getitem__, within=600)
    assert failure.value.layer == len(TEMPLATES["base"].layers)
    assert "exit status 3" in str(failure.value)
    assert "about to fail" in str(failure.value)
    assert not runtime.images.is_built(template)
    assert runtime.sandbox_ids() == []  # the build sandbox is gone


async def test_a_ready_command_that_never_succeeds_fails_the_build_at_its_finish(runtime: LocalRuntime) -> None:
    template = _template([], ready="false")
    with pytest.raises(TemplateBuildFailed) as failure:
        await asyncio.wait_for(
            runtime.build_template(template, lambda *_: None, files=NO_FILES.__getitem__, within=3), timeout=60
        )
    assert failure.value.layer is None
    assert runtime.sandbox_ids() == []


async def test_the_base_root_has_the_updates_and_security_suites(runtime: LocalRuntime) -> None:
    key = runtime.images.plan(TEMPLATES["base"])[0][0]
    sources = (IMAGE_CACHE / "layers" / key / "etc/apt/sources.list").read_text().splitlines()
    assert "deb http://deb.debian.org/debian bookworm-updates main" in sources
    assert "deb http://deb.debian.org/debian-security bookworm-security main" in sources


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in members.items():
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(content), 0o644
            tar.addfile(member, io.BytesIO(content))
    return buffer.getvalue()


async def test_copy_runs_on_the_images_python_with_dockers_rules(runtime: LocalRuntime, tmp_path: Path) -> None:
    """COPY's helper runs on the image's own Python (3.11.2): hidden files match a glob, a name with brackets is
    a name, and a directory that is there already keeps its mode and owner."""
    nonce = uuid.uuid4().hex
    archive = tmp_path / "files.tar"
    archive.write_bytes(_tar({".env": b"A=1\n", "app/[id]/page.txt": b"page\n", "kept/readme": b"hi\n"}))
    layers: list[Layer] = [
        RunLayer(script="mkdir -p /srv/kept && chmod 0750 /srv/kept", rebuild=nonce),
        CopyLayer(files=HASH, source="*", dest="/srv/hidden/", rebuild=nonce),
        CopyLayer(files=HASH, source=".", dest="/srv/", user="user", rebuild=nonce),  # merges into /srv/kept
        CopyLayer(files=HASH, source="app/[id]/page.txt", dest="/srv/page.txt", rebuild=nonce),
    ]
    template = _template(layers)
    try:
        await runtime.build_template(template, lambda *_: None, files={HASH: archive}.__getitem__, within=600)
        await runtime.start(spec("copyrules1", template))
        script = "stat -c '%a %U' /srv/kept /srv/kept/readme; cat /srv/hidden/.env /srv/page.txt"
        shown = await _run(runtime, "copyrules1", script)
        assert shown.splitlines() == ["750 root", "644 user", "A=1", "page"]
    finally:
        await runtime.stop("copyrules1")
        _forget_layers(runtime, template)


async def test_a_builtin_templates_copy_layer_takes_its_files_from_the_templates_directory(
    runtime: LocalRuntime, tmp_path: Path
) -> None:
    directory = templates_with_copy(tmp_path / "templates")
    (directory / "files/app/nonce").write_text(uuid.uuid4().hex)  # a layer of this test's own
    template = load_templates(directory)["tools"]
    try:
        await runtime.build_builtin(template, lambda _line: None)
        await runtime.start(spec("tomlcopy1", template))
        shown = await _run(runtime, "tomlcopy1", "stat -c '%a %U %n' /srv/app/hello.txt /srv/app/sub/run.sh; "
                                                 "cat /srv/app/hello.txt")  # fmt: skip
        assert shown.splitlines() == ["640 user /srv/app/hello.txt", "640 user /srv/app/sub/run.sh", "hello"]
        (directory / "files/app/hello.txt").write_text("edited after loading\n")
        _forget_layers(runtime, template)
        with pytest.raises(TemplateBuildFailed, match="COPY files/app /srv/app: copy source 'files/app' changed"):
            await runtime.build_builtin(template, lambda _line: None)
    finally:
        await runtime.stop("tomlcopy1")
        _forget_layers(runtime, template)
