"""The commands that build layers: debootstrap, a chroot over an overlay, and the executor install.

Everything here runs as root on the host and blocks; `ImageStore` calls it under its build lock.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from pool._templates import DebootstrapLayer

__all__ = ["EXECUTOR_DEPENDENCIES", "build_debootstrap", "install_executor", "run_in_overlay"]

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
    _run(["chroot", str(target), "/bin/sh", "-c", _SANDBOX_SETUP])


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


def install_executor(source: Path, base: Path, upper: Path, work: Path) -> None:
    """Copy the executor package and install its two wheels with the sandbox's own Python."""
    home = upper / EXECUTOR_HOME.lstrip("/")
    shutil.copytree(source, home / "executor", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (home / "run-executor.py").write_text(_RUN_EXECUTOR)
    # The sandbox's passwordless sudo (executor/_sudo.py), ahead of the setuid one that no_new_privs disables.
    (upper / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    (upper / "usr/local/bin/sudo").symlink_to(f"{EXECUTOR_HOME}/executor/sudo.py")
    script = (
        f"python3 -m pip install -q --no-cache-dir --disable-pip-version-check --break-system-packages "
        f"--target {EXECUTOR_HOME}/lib {EXECUTOR_DEPENDENCIES}\npython3 -m compileall -q {EXECUTOR_HOME}"
    )
    run_in_overlay([base], upper, work, script)
