"""The commands that build layers: debootstrap, a chroot over an overlay, an image pulled, the executor install.

Everything here runs as root on the host and blocks; `ImageStore` calls it under its build lock. A pulled
image is nobody's trusted code, so nothing of it runs here: its executor layer gets its wheels from this
server's own pip, for the image's Python and glibc, instead of from the image's python3 in a chroot.
"""

from __future__ import annotations

import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from pool._errors import ImageBuildError
from pool._local import _oci
from pool._local._oci_root import ImageUnfit, RootFacts, prepare_root
from pool._local._oci_unpack import UnpackStats, UnsafeImage, apply_layer
from pool._runtime import RegistryLogin
from pool._templates import DebootstrapLayer, OciLayer

__all__ = [
    "EXECUTOR_DEPENDENCIES", "build_debootstrap", "build_oci", "install_executor", "install_executor_wheels",
    "run_in_overlay",
]  # fmt: skip

EXECUTOR_DEPENDENCIES = "msgspec==0.23.0 httptools==0.9.0"
EXECUTOR_HOME = "/opt/agent-sandbox"

_SANDBOX_SETUP = """
set -e
useradd --create-home --uid 1000 --user-group --shell /bin/bash user
echo sandbox > /etc/hostname
printf '127.0.0.1 localhost sandbox\\n::1 localhost\\n' > /etc/hosts
printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/*.log /tmp/* /root/.cache
"""

_NO_UPDATES = ("sid", "unstable")  # suites without -updates and -security
_CLEANUP = "rm -rf /tmp/* /root/.cache /var/cache/apt/*.bin"

# Started by bubblewrap as the sandbox's pid 1: -I -S keep start-up short and the host's paths out.
_RUN_EXECUTOR = f"""import runpy
import sys

sys.path[:0] = ["{EXECUTOR_HOME}/lib", "{EXECUTOR_HOME}"]
runpy.run_module("executor", run_name="__main__", alter_sys=True)
"""


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def build_debootstrap(layer: DebootstrapLayer, target: Path) -> None:
    include = ",".join(layer.packages)
    argv = ["debootstrap", "--variant=minbase", *([f"--include={include}"] if include else [])]
    _run([*argv, layer.suite, str(target), layer.mirror])
    if layer.updates and layer.suite not in _NO_UPDATES:
        _apply_updates(layer, target)
    _run(["chroot", str(target), "/bin/sh", "-c", _SANDBOX_SETUP])


def _apply_updates(layer: DebootstrapLayer, target: Path) -> None:
    """Name the -updates and -security suites in the root's apt sources and install what they update."""
    security = layer.mirror.rstrip("/") + "-security" if layer.mirror.rstrip("/").endswith("/debian") else None
    sources = [f"deb {layer.mirror} {layer.suite} main", f"deb {layer.mirror} {layer.suite}-updates main"]
    if security:
        sources.append(f"deb {security} {layer.suite}-security main")
    (target / "etc/apt/sources.list").write_text("\n".join(sources) + "\n")
    t = shlex.quote(str(target))
    upgrade = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -y -qq upgrade"
    _run(["unshare", "--mount", "--propagation", "private", "--fork", "/bin/sh", "-c",
          f"mount --bind /etc/resolv.conf {t}/etc/resolv.conf && mount -t proc proc {t}/proc && "
          f"chroot {t} /bin/sh -c {shlex.quote(upgrade)}"])  # fmt: skip


def run_in_overlay(lowers: list[Path], upper: Path, work: Path, script: str) -> None:
    """Run `script` as root chrooted into `lowers` (top first) with its changes landing in `upper`."""
    merged, overlay_work = work / "merged", work / "overlay-work"
    for d in (upper, merged, overlay_work):
        d.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={':'.join(map(str, lowers))},upperdir={upper},workdir={overlay_work}"
    m = shlex.quote(str(merged))
    setup = (
        f"mount -t overlay overlay -o {shlex.quote(options)} {m} && mount -t proc proc {m}/proc && "
        f"mount --rbind /dev {m}/dev && mount --bind /etc/resolv.conf {m}/etc/resolv.conf && "
        # The host's CA bundle, so downloads work behind the same TLS-inspecting proxies as the host's.
        f"mount --bind /etc/ssl/certs/ca-certificates.crt {m}/etc/ssl/certs/ca-certificates.crt && "
        f"chroot {m} /bin/sh -c {shlex.quote(f'set -e{chr(10)}{script}{chr(10)}{_CLEANUP}')}"
    )
    _run(["unshare", "--mount", "--propagation", "private", "--fork", "/bin/sh", "-c", setup])


def build_oci(
    layer: OciLayer, target: Path, work: Path, login: RegistryLogin | None, log: Callable[[str], None]
) -> None:
    """Pull `layer`'s pinned image, apply its layers into `target` and complete the root a sandbox needs."""
    if not layer.digest:
        raise ImageBuildError(f"image {layer.image!r}: an oci layer is built from a pinned digest only")
    pulled = work / "pull"
    try:
        tars = _oci.pull(layer.image, layer.digest, login, pulled)
    except _oci.RegistryError as exc:
        raise ImageBuildError(_oci.unavailable(layer.image, exc)) from exc
    target.mkdir(mode=0o755)
    stats = UnpackStats()
    try:
        for tar in tars:
            apply_layer(tar, target, stats)
            tar.unlink()  # the disk holds one decompressed layer less as it goes
        prepare_root(target)
    except UnsafeImage as exc:
        raise ImageBuildError(f"image {layer.image!r} was refused: {exc}") from exc
    except ImageUnfit as exc:
        raise ImageBuildError(
            f"image {layer.image!r} cannot be a sandbox's base here: {exc}; bases that work: {_oci.BASES_HERE}"
        ) from exc
    finally:
        shutil.rmtree(pulled, ignore_errors=True)
    skipped = f", {stats.devices} device nodes skipped" if stats.devices else ""
    log(f"unpacked {len(tars)} image layers of {layer.image}@{layer.digest}: {stats.entries} entries{skipped}")


def install_executor(source: Path, base: Path, upper: Path, work: Path) -> None:
    """Copy the executor package and install its two wheels with the sandbox's own Python."""
    _copy_executor(source, upper)
    script = (
        f"python3 -m pip install -q --no-cache-dir --disable-pip-version-check --break-system-packages "
        f"--target {EXECUTOR_HOME}/lib {EXECUTOR_DEPENDENCIES}\npython3 -m compileall -q {EXECUTOR_HOME}"
    )
    run_in_overlay([base], upper, work, script)


def install_executor_wheels(source: Path, facts: RootFacts, upper: Path) -> None:
    """Copy the executor package and install its two wheels for the image's Python and glibc with this
    server's pip (`--target`, binary wheels only): nothing of the image runs on the host."""
    _copy_executor(source, upper)
    home = upper / EXECUTOR_HOME.lstrip("/")
    version = f"{facts.python[0]}.{facts.python[1]}"
    machine = platform.machine()
    # Every manylinux tag the image's glibc satisfies, newest first (pip takes the listed tags only).
    platforms = [f"manylinux_{facts.glibc[0]}_{minor}_{machine}" for minor in range(facts.glibc[1], 16, -1)]
    same = facts.python == sys.version_info[:2]
    argv = [
        sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--disable-pip-version-check",
        "--target", str(home / "lib"), "--only-binary=:all:", "--implementation", "cp", "--python-version", version,
        "--abi", f"cp{facts.python[0]}{facts.python[1]}", *(f"--platform={p}" for p in platforms),
        f"--platform=manylinux2014_{machine}", *([] if same else ["--no-compile"]), *EXECUTOR_DEPENDENCIES.split(),
    ]  # fmt: skip
    try:
        _run(argv)
    except subprocess.CalledProcessError as exc:
        raise ImageBuildError(
            f"no wheels of {EXECUTOR_DEPENDENCIES} for the image's Python {version} and glibc "
            f"{facts.glibc[0]}.{facts.glibc[1]}: {exc.stderr or exc}"
        ) from exc
    if same:  # byte code this server's Python writes is the image's too; another version compiles its own
        _run([sys.executable, "-m", "compileall", "-q", "-s", str(upper), "-p", "/", str(home)])


def _copy_executor(source: Path, upper: Path) -> None:
    home = upper / EXECUTOR_HOME.lstrip("/")
    shutil.copytree(source, home / "executor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (home / "run-executor.py").write_text(_RUN_EXECUTOR)
    # The sandbox's passwordless sudo (executor/_sudo.py), ahead of the setuid one that no_new_privs disables.
    (upper / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    (upper / "usr/local/bin/sudo").symlink_to(f"{EXECUTOR_HOME}/executor/sudo.py")
