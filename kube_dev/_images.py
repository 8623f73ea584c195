"""The real node's images: built with buildah from `deploy/Dockerfile.*` unmodified, with no registry anywhere.

The Dockerfiles start `FROM python:3.11-slim-bookworm` and `FROM debian:bookworm-slim`, which live on a
registry this machine cannot reach; buildah resolves them locally (`--pull=never`) once images of those names
exist. They are made here: `debian:bookworm-slim` is a debootstrap minbase root of Debian 12 with upstream's
apt sources, and `python:3.11-slim-bookworm` is that plus Debian's `python3`, `python3-venv` and
`python-is-python3` (Debian's 3.11.2 in /usr/bin where upstream has its own 3.11 in /usr/local: the gateway
runs on Debian's; the sandbox images take python3 from apt either way). They are made once per recipe.

Each image of the node is keyed by a hash of what it is built from (its Dockerfile and the files its
`.dockerignore` lets in), kept in buildah's own store under `IMAGE_CACHE` and pushed once to an OCI
archive there, which `up --real-node` imports into the node's containerd. A rebuild with one file
changed reuses buildah's cached steps (`--layers`): the apt and pip steps come from the cache.

On a network whose TLS is intercepted, pip inside a RUN step needs the host's CA bundle: it is bind-mounted
for the RUN steps alone (at /etc/pip-ca.crt, with a pip.conf naming it) and never lands in a layer.
"""

from __future__ import annotations

import fcntl
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import msgspec

__all__ = ["IMAGE_CACHE", "PAUSE_IMAGE", "ImageError", "build_images"]

IMAGE_CACHE = Path(os.environ.get("AGENT_SANDBOX_KUBE_IMAGES", "/var/cache/agent-sandbox/kube-images"))
_RECIPE = b"kube-images r1"
_REPO = Path(__file__).resolve().parents[1]
_HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PAUSE_IMAGE = "registry.local/agent-sandbox/pause:3.4.1"  # containerd's sandbox_image; never pulled


class NodeImage(msgspec.Struct, frozen=True, kw_only=True):
    """One image the node runs that a Dockerfile builds: its full reference, and that Dockerfile."""

    name: str
    dockerfile: str


NODE_IMAGES = (
    NodeImage(name="docker.io/agent-sandbox/sandbox-base:0.1.0", dockerfile="deploy/Dockerfile.sandbox-base"),
    NodeImage(name="docker.io/agent-sandbox/gateway:0.1.0", dockerfile="deploy/Dockerfile.gateway"),
)
_DEBIAN = "docker.io/library/debian:bookworm-slim"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PYTHON = "docker.io/library/python:3.11-slim-bookworm"


class ImageError(Exception):
    """An image could not be built; the message has the failing command's output."""


class _Built(msgspec.Struct, kw_only=True):
    keys: dict[str, str] = {}  # image name → key of what it was built from


def _log(message: str) -> None:
    print(f"kube-dev-cluster images: {message}", file=sys.stderr)


def _store_args() -> list[str]:
    return ["--root", str(IMAGE_CACHE / "store"), "--runroot", str(IMAGE_CACHE / "runroot")]


def _buildah(*args: str) -> str:
    argv = ["buildah", *_store_args(), *args]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=_REPO)
    if result.returncode != 0:
        raise ImageError(f"buildah {args[0]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout.strip()


def _context_files(dockerfile: Path) -> list[Path]:
    """The files `docker build` would send. Every `.dockerignore` under deploy/ is an allow-list (`**`, then
    `!path` or `!dir/**` lines, then `**/name` exclusions); anything else is refused rather than misread."""
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    rules = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    allowed = [rule[1:].removesuffix("/**") for rule in rules[1:] if rule.startswith("!")]
    excluded = [rule.removeprefix("**/") for rule in rules[1:] if not rule.startswith("!")]
    if rules[:1] != ["**"] or any(set(pattern) & set("*?[") for pattern in allowed):
        raise ImageError(f"{ignore.name} is not an allow-list of paths this builder can hash")
    files = []
    for pattern in allowed:
        top = _REPO / pattern
        for path in [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file()):
            parts = path.relative_to(_REPO).parts
            if not any(fnmatch.fnmatchcase(part, rule) for part in parts for rule in excluded):
                files.append(path)
    return files


def _dockerfile_key(image: NodeImage, base_key: str) -> str:
    digest = hashlib.sha256(_RECIPE + base_key.encode())
    dockerfile = _REPO / image.dockerfile
    for path in [dockerfile, *_context_files(dockerfile)]:
        digest.update(path.relative_to(_REPO).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _debootstrap(root: Path) -> None:
    """Debian 12 minbase, with the apt sources upstream's slim image has."""
    mirror = os.environ.get("AGENT_SANDBOX_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    result = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root), mirror],
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        raise ImageError(f"debootstrap failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    security = mirror.rstrip("/") + "-security"
    (root / "etc/apt/sources.list").write_text(
        f"deb {mirror} bookworm main\ndeb {mirror} bookworm-updates main\ndeb {security} bookworm-security main\n"
    )
    shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True)


@contextmanager
def _working_container(base: str = "scratch") -> Iterator[tuple[str, Path]]:
    """A buildah working container of `base` and where its root is mounted; removed at the end."""
    container = _buildah("from", "--pull=never", base)
    try:
        yield container, Path(_buildah("mount", container))
    finally:
        subprocess.run(["buildah", *_store_args(), "rm", container], capture_output=True)


def _make_debian(work: Path) -> None:
    root = work / "debian-root"
    shutil.rmtree(root, ignore_errors=True)
    _debootstrap(root)
    try:
        with _working_container() as (container, mounted):
            # cp -a keeps owners, modes, hard links, xattrs (file capabilities) and ACLs.
            copied = subprocess.run(["cp", "-a", f"{root}/.", f"{mounted}/"], capture_output=True, text=True)
            if copied.returncode != 0:
                raise ImageError(f"copying the root into the image failed: {copied.stderr[-2000:]}")
            _buildah("config", "--env", f"PATH={_PATH}", "--cmd", "bash", container)
            _buildah("commit", "--quiet", container, _DEBIAN)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _make_python() -> None:
    install = (
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends"
        " python3 python3-venv python-is-python3 >/dev/null && apt-get clean && rm -rf /var/lib/apt/lists/*"
    )
    with _working_container(_DEBIAN) as (container, _):
        _buildah("run", "--isolation", "chroot", container, "--", "sh", "-c", install)
        _buildah("config", "--env", f"PATH={_PATH}", "--env", "LANG=C.UTF-8", "--cmd", "python3", container)
        _buildah("commit", "--quiet", container, _PYTHON)


def _make_pause(pause_binary: Path) -> None:
    with _working_container() as (container, mounted):
        shutil.copy2(pause_binary, mounted / "pause")
        _buildah("config", "--entrypoint", '["/pause"]', "--cmd", "", container)
        _buildah("commit", "--quiet", container, PAUSE_IMAGE)


def _build_dockerfile(image: NodeImage, work: Path) -> None:
    pip_conf = work / "pip.conf"
    pip_conf.write_text("[global]\ncert = /etc/pip-ca.crt\n")
    _buildah(
        "bud", "--pull=never", "--isolation", "chroot", "--layers", "--quiet",
        "-v", f"{_HOST_CA}:/etc/pip-ca.crt:ro", "-v", f"{pip_conf}:/etc/pip.conf:ro",
        "-f", image.dockerfile, "-t", image.name, ".",
    )  # fmt: skip


def _archive(name: str, key: str) -> Path:
    return IMAGE_CACHE / "archives" / f"{name.rsplit('/', 1)[-1].replace(':', '_')}-{key}.tar"


def _read_built() -> _Built:
    try:
        return msgspec.json.decode((IMAGE_CACHE / "built.json").read_bytes(), type=_Built)
    except (OSError, msgspec.DecodeError):
        return _Built()


def _write_built(built: _Built) -> None:
    temporary = IMAGE_CACHE / "built.json.tmp"
    temporary.write_bytes(msgspec.json.encode(built))
    temporary.rename(IMAGE_CACHE / "built.json")


def _exists(name: str) -> bool:
    argv = ["buildah", *_store_args(), "inspect", "--type", "image", "--format", "{{.FromImageID}}", name]
    return subprocess.run(argv, capture_output=True).returncode == 0


def _ensure(built: _Built, name: str, key: str, make: Callable[[], None], *, push: bool = True) -> None:
    """Build `name` unless it is built from `key` already; with `push`, also into its archive for the node."""
    archive = _archive(name, key)
    if built.keys.get(name) == key and (archive.exists() if push else _exists(name)):
        return
    started = time.monotonic()
    make()
    size = ""
    if push:
        archive.parent.mkdir(parents=True, exist_ok=True)
        for old in archive.parent.glob(archive.name.rsplit("-", 1)[0] + "-*.tar"):
            old.unlink()
        partial_archive = archive.with_suffix(".partial")
        partial_archive.unlink(missing_ok=True)
        _buildah("push", "--quiet", name, f"oci-archive:{partial_archive}:{name}")
        partial_archive.rename(archive)
        size = f" ({archive.stat().st_size // 2**20} MiB archive)"
    built.keys[name] = key
    _write_built(built)
    _log(f"{name} built in {time.monotonic() - started:.0f} s{size}")


def build_images(pause_binary: Path) -> list[Path]:
    """Build what is missing or out of date; the OCI archives of every image the node runs (pause first)."""
    if shutil.which("buildah") is None:
        raise ImageError("buildah is missing: run scripts/setup --test (it installs it)")
    if not pause_binary.exists():
        raise ImageError(f"{pause_binary} is missing: run `scripts/kube-dev-cluster build --real-node` first")
    IMAGE_CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(IMAGE_CACHE, 0o700)
    # One build at a time on the machine: two would race on built.json and on the archives they write.
    with (IMAGE_CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_all(pause_binary)


def _build_all(pause_binary: Path) -> list[Path]:
    built = _read_built()
    work = IMAGE_CACHE / "work"
    work.mkdir(exist_ok=True)
    pause_key = hashlib.sha256(_RECIPE + pause_binary.read_bytes()).hexdigest()[:16]
    # The FROM images are made once per recipe: a rebuild of Debian's archive would change them every day.
    from_key = hashlib.sha256(_RECIPE + b"debootstrap bookworm minbase").hexdigest()[:16]
    _ensure(built, PAUSE_IMAGE, pause_key, partial(_make_pause, pause_binary))
    _ensure(built, _DEBIAN, from_key, partial(_make_debian, work), push=False)
    _ensure(built, _PYTHON, from_key, _make_python, push=False)
    archives = [_archive(PAUSE_IMAGE, pause_key)]
    for image in NODE_IMAGES:
        key = _dockerfile_key(image, from_key)
        _ensure(built, image.name, key, partial(_build_dockerfile, image, work))
        archives.append(_archive(image.name, key))
    return archives
