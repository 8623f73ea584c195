"""Real container registries on loopback (Debian's docker-registry), and images pushed to them with Debian's
tools (umoci builds the OCI layout from a root the test makes, skopeo pushes it), for the template builds that
pull a base from a registry. Only 127.0.0.1 is ever spoken to: the server under test pulls over loopback too.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_for
from tests.server_fixtures import free_port, stop_process

__all__ = ["Registry", "build_layout", "debian_root", "push", "running_registry"]

REGISTRY = Path("/usr/bin/docker-registry")
LAYERS = Path("/var/cache/agent-sandbox/images/layers")


@dataclass(frozen=True)
class Registry:
    """A registry serving on `address` (host:port); `login` is (username, password) when it demands one."""

    address: str
    login: tuple[str, str] | None = None


def require_tools() -> None:
    missing = [tool for tool in ("skopeo", "umoci", "htpasswd") if shutil.which(tool) is None]
    if missing or not REGISTRY.exists():
        pytest.fail(f"missing {', '.join(missing) or REGISTRY}: run scripts/install-system-packages")


@contextmanager
def running_registry(directory: Path, login: tuple[str, str] | None = None) -> Iterator[Registry]:
    """`docker-registry serve` on a free loopback port with its storage in `directory`, with htpasswd (bcrypt)
    basic auth when `login` is given (the registry accepts it over plain HTTP), until the block ends."""
    require_tools()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    auth = ""
    if login is not None:
        htpasswd = subprocess.run(
            ["htpasswd", "-niB", login[0]], input=login[1], capture_output=True, text=True, check=True
        ).stdout
        (directory / "htpasswd").write_text(htpasswd)
        auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {directory / 'htpasswd'}\n"
    config = directory / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {directory / 'storage'}\n"
        f"{auth}http:\n  addr: 127.0.0.1:{port}\n  secret: test-only\n"
    )
    with open(directory / "registry.log", "w") as log:
        process = subprocess.Popen([str(REGISTRY), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:

        def answers() -> bool:
            if process.poll() is not None:
                pytest.fail(f"docker-registry exited: {(directory / 'registry.log').read_text()[-2000:]}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code in (200, 401)
            except httpx.TransportError:
                return False

        wait_for(answers, what=f"the registry on 127.0.0.1:{port}", within=30)
        yield Registry(f"127.0.0.1:{port}", login)
    finally:
        stop_process(process)


def debian_root() -> Path:
    """The Debian 12 root this machine's image cache already has (the `base` template's debootstrap layer)."""
    for layer in sorted(LAYERS.glob("debootstrap-*")):
        if (layer / "usr/bin/python3.11").exists() and (layer / "etc/debian_version").read_text().startswith("12"):
            return layer
    pytest.fail(f"no Debian 12 debootstrap layer in {LAYERS}: run `agent-sandbox images build` first")


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def build_layout(
    layout: Path, tag: str, base: Path | None, edits: list[Callable[[Path], None]], *, env: dict[str, str], workdir: str
) -> str:
    """An OCI layout `layout` with image `tag`: a first layer holding a copy of `base` (or nothing) changed by
    `edits[0]`, then one layer per further edit of the root (umoci repack writes what changed, and a whiteout
    for what is gone); the config's Env, WorkingDir and a User E2B's `user` must replace."""
    image = f"{layout}:{tag}"
    if not layout.exists():
        _run("umoci", "init", "--layout", str(layout))
    _run("umoci", "new", "--image", image)
    bundle = layout.parent / f"{layout.name}-{tag}-bundle"
    shutil.rmtree(bundle, ignore_errors=True)
    _run("umoci", "unpack", "--image", image, str(bundle))
    if base is not None:
        _run("cp", "-a", f"{base}/.", str(bundle / "rootfs"))
    for edit in edits:
        edit(bundle / "rootfs")
        _run("umoci", "repack", "--refresh-bundle", "--image", image, str(bundle))
    shutil.rmtree(bundle, ignore_errors=True)
    settings = [f"--config.env={name}={value}" for name, value in env.items()]
    _run("umoci", "config", "--image", image, f"--config.workingdir={workdir}", "--config.user=nobody", *settings)
    return image


def push(image: str, registry: Registry, name: str) -> str:
    """Copy the OCI layout image `image` to `registry` as `name` (repository:tag); its reference there."""
    creds = ["--dest-creds", f"{registry.login[0]}:{registry.login[1]}"] if registry.login else []
    reference = f"{registry.address}/{name}"
    _run("skopeo", "copy", "--quiet", "--dest-tls-verify=false", *creds, f"oci:{image}", f"docker://{reference}")
    return reference
