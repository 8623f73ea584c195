"""The images beside install.yaml (deploy/Dockerfile.*): they cannot be built here (no container engine),
so they are parsed with Docker's own parser and checked against what they must agree with."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile  # type: ignore[import-not-found]
import pytest

from executor.envd import ENVD_PORT
from pool._local._layer_steps import EXECUTOR_DEPENDENCIES
from tests.server_fixtures import REPO

DEPLOY = REPO / "deploy"
DOCKERFILES = sorted(p for p in DEPLOY.glob("Dockerfile.*") if p.suffix != ".dockerignore")
SANDBOX_KINDS = {
    "base": "debootstrap,apt", "base-node": "apt", "code-interpreter-v1": "apt,pip,run", "chromium": "apt,run",
    "desktop": "apt,run", "coding-agents": "pip,run", "mcp-gateway": "pip,run",
}  # fmt: skip
LAYERLESS = {"browser"}  # templates whose image is their parent's: no layer of their own


def _commands(path: Path) -> list[dockerfile.Command]:
    return list(dockerfile.parse_file(str(path)))


def _whitelist(path: Path) -> list[str]:
    ignore = path.with_name(path.name + ".dockerignore").read_text().splitlines()
    return [line[1:].removesuffix("/**") for line in ignore if line.startswith("!")]


def test_every_image_has_its_dockerfile() -> None:
    names = {p.name.removeprefix("Dockerfile.") for p in DOCKERFILES}
    assert names == {"gateway", *(f"sandbox-{kind}" for kind in (*SANDBOX_KINDS, *LAYERLESS))}
    images = set(re.findall(r"agent-sandbox/(sandbox-[a-z0-9-]+|gateway):", (REPO / "install.yaml").read_text()))
    assert images <= names


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_parses_and_copies_only_what_exists_and_is_not_ignored(path: Path) -> None:
    commands = _commands(path)
    assert next(c.cmd for c in commands if c.cmd != "ARG") == "FROM"
    allowed = _whitelist(path)
    for copy in (c for c in commands if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags)):
        for source in copy.value[:-1]:
            assert (REPO / source).exists(), f"{path.name}: COPY {source}: no such file"
            assert any(source == a or source.startswith(a + "/") for a in allowed), f"{source} is .dockerignored"


def test_sandbox_base_runs_the_executor_on_its_port_with_the_local_runtimes_wheels() -> None:
    commands = _commands(DEPLOY / "Dockerfile.sandbox-base")
    entrypoint = next(c for c in commands if c.cmd == "ENTRYPOINT")
    assert entrypoint.json
    assert entrypoint.value[-4:] == ("--host", "0.0.0.0", "--port", str(ENVD_PORT))
    assert any(EXECUTOR_DEPENDENCIES in " ".join(c.value) for c in commands if c.cmd == "RUN")


@pytest.mark.parametrize(("kind", "kinds"), SANDBOX_KINDS.items())
def test_sandbox_images_install_all_of_their_templates_packages(kind: str, kinds: str) -> None:
    name = {"base": "base", "base-node": "sandbox-base-node"}.get(kind, kind)
    path = REPO / "templates" / f"{name}.toml"
    assert f"templates/{name}.toml" in (DEPLOY / f"Dockerfile.sandbox-{kind}").read_text()
    own_layers = tomllib.loads(path.read_text())["layers"]
    assert {layer["kind"] for layer in own_layers} <= set(kinds.split(",")), "a layer of the template is left out"
    packaged = ",".join(k for k in kinds.split(",") if k != "run")
    printed = subprocess.run(
        [sys.executable, str(DEPLOY / "template-packages.py"), str(path), packaged],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert printed == [package for layer in own_layers if layer["kind"] != "run" for package in layer["packages"]]
    assert printed
    if "run" in kinds:
        scripts = subprocess.run(
            [sys.executable, str(DEPLOY / "template-packages.py"), str(path), "run"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert scripts == "".join(layer["script"] + "\n" for layer in own_layers if layer["kind"] == "run")
        assert (
            "template-packages.py /tmp/template/" + path.name + " run | bash -e"
            in (DEPLOY / f"Dockerfile.sandbox-{kind}").read_text()
        )


def test_a_layerless_templates_image_is_its_parents() -> None:
    for name in LAYERLESS:
        template = tomllib.loads((REPO / "templates" / f"{name}.toml").read_text())
        assert not template.get("layers")
        assert f"sandbox-{template['parent']}:" in (DEPLOY / f"Dockerfile.sandbox-{name}").read_text()


def test_gateway_image_runs_unprivileged_as_install_yaml_expects() -> None:
    commands = _commands(DEPLOY / "Dockerfile.gateway")
    assert next(c for c in commands if c.cmd == "USER").value == ("10001:10001",)
    assert next(c for c in commands if c.cmd == "ENTRYPOINT").value == ("agent-sandbox",)
    # Its default command serves on a cluster: the local runtime needs root, which the image is not.
    assert next(c for c in commands if c.cmd == "CMD").value[:3] == ("serve", "--runtime", "kubernetes")
    install = (REPO / "install.yaml").read_text()
    assert "runAsUser: 10001" in install
    assert "readOnlyRootFilesystem: true" in install
