"""Can this machine run sandboxes? Real trials of what the local runtime needs, for `agent-sandbox doctor`.

Each check says what it found; the `required` ones decide whether sandboxes can run at all. The trials
are the runtime's own steps on a small scale (an id-shifted layer under an overlay in a throwaway mount
namespace, one sandbox started and stopped, CRIU dumping and restoring a TCP listener), because a kernel
or a tool that is present can still refuse the exact calls the runtime makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from pool._errors import PoolError, RuntimeFailure
from pool._local._cgroups import cgroup_layout
from pool._local._criu import probe
from pool._local._disk import DiskImages, disk_usage
from pool._local._egress_policy import ALWAYS_DENIED, EgressPolicy
from pool._local._images import ImageStore
from pool._local._nft import run_nft
from pool._local._runtime import LocalRuntime, LocalRuntimeSettings
from pool._local._seccomp import seccomp_filter
from pool._local._syscalls import CLONE_NEWNET, CLONE_NEWNS, bind_idmapped, make_mounts_private, mount, unshare
from pool._local._userns import create_userns, host_id_base
from pool._runtime import EgressRules, ExecutorInit, SandboxSpec
from pool._templates import Template

__all__ = ["PlatformCheck", "check_platform"]


class PlatformCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One finding: `required` checks must pass for sandboxes to run; the others say what works less well."""

    name: str
    ok: bool
    detail: str
    required: bool = True


def check_platform(
    *,
    data_dir: Path,
    image_cache: Path,
    executor_source: Path,
    templates: Mapping[str, Template],
    criu_dir: Path | None,
) -> list[PlatformCheck]:
    """Run every check (blocking, about a second; not inside an event loop)."""
    images = ImageStore(image_cache, executor_source)
    built = {name: images.is_built(template) for name, template in templates.items()}
    checks = [_root(), _bubblewrap(), _cgroups(), _idmapped_overlay(), _disk_limit(data_dir), _seccomp(), _nftables()]
    if all(check.ok for check in checks):
        checks.append(_sandbox(data_dir, image_cache, executor_source, templates, built))
    listing = ", ".join(f"{name}: {'built' if ok else 'not built'}" for name, ok in built.items())
    hint = "" if all(built.values()) else " (serve builds what is missing on start; or `agent-sandbox images build`)"
    checks.append(PlatformCheck(name="images", ok=all(built.values()), detail=listing + hint, required=False))
    checks.append(_criu(criu_dir))
    return checks


def _root() -> PlatformCheck:
    return PlatformCheck(name="root", ok=os.geteuid() == 0, detail=f"euid {os.geteuid()} (sandboxes need root)")


def _bubblewrap() -> PlatformCheck:
    try:
        out = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return PlatformCheck(name="bubblewrap", ok=False, detail=f"bwrap does not run: {exc}")
    return PlatformCheck(name="bubblewrap", ok=True, detail=out.strip())


def _cgroups() -> PlatformCheck:
    mode, controllers = cgroup_layout()
    missing = {"memory", "pids", "cpu"} - set(controllers)
    ok = mode != "none" and not missing
    detail = f"{mode}: {' '.join(controllers)}" + (f" (missing {' '.join(sorted(missing))})" if missing else "")
    return PlatformCheck(name="cgroups", ok=ok, detail=detail)


def _seccomp() -> PlatformCheck:
    try:
        seccomp_filter()
        actions = Path("/proc/sys/kernel/seccomp/actions_avail").read_text().split()
    except (KeyError, OSError) as exc:
        return PlatformCheck(name="seccomp", ok=False, detail=f"no filter for {platform.machine()}: {exc!r}")
    ok = "errno" in actions
    return PlatformCheck(
        name="seccomp", ok=ok, detail=f"{platform.machine()} filter; kernel actions: {' '.join(actions)}"
    )


def _nftables() -> PlatformCheck:
    """Sandbox egress puts an nftables table into each sandbox's namespace through libnftables: tried in a
    throwaway network namespace (the sandbox trial then sets up a whole egress path)."""
    try:
        error = _in_child(_nft_trial)
    except OSError as exc:
        error = str(exc)
    if error:
        return PlatformCheck(name="nftables", ok=False, detail=f"sandbox egress rules cannot be set: {error}")
    return PlatformCheck(name="nftables", ok=True, detail="libnftables sets a sandbox's egress table")


def _nft_trial() -> str:
    unshare(CLONE_NEWNET)
    run_nft(EgressPolicy(EgressRules(), always_denied=ALWAYS_DENIED).ruleset("agent_sandbox_doctor", replace=False))
    return ""


def _in_child(trial: Callable[[], str]) -> str:
    """Run `trial` in a forked child, so the namespaces it enters stay there; returns "" or what failed."""
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and _exit, whatever happens
        message = ""
        try:
            message = trial()
        except BaseException as exc:
            message = str(exc) or repr(exc)
        finally:
            os.write(report_w, message.encode())
            os._exit(0)
    os.close(report_w)
    try:
        with os.fdopen(report_r, "rb") as report:
            return report.read().decode(errors="replace")
    finally:
        os.waitpid(pid, 0)


def _idmapped_overlay() -> PlatformCheck:
    """A root-owned file in an id-mapped layer under an overlay must show the sandbox's root uid."""
    name = "user namespaces"
    work = Path(tempfile.mkdtemp(prefix="agent-sandbox-doctor-"))
    try:
        error = _idmap_trial(work)
    except OSError as exc:
        error = str(exc)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if error:
        return PlatformCheck(name=name, ok=False, detail=f"id-mapped overlay root does not work: {error}")
    return PlatformCheck(
        name=name, ok=True, detail=f"root-created, id-mapped overlay root works (0 -> {host_id_base(0)})"
    )


def _disk_limit(data_dir: Path) -> PlatformCheck:
    """A sandbox's own filesystem (`_disk`): an ext4 image made, loop-mounted and unmounted where sandboxes live."""
    work = Path(tempfile.mkdtemp(prefix="doctor-disk-", dir=data_dir if data_dir.is_dir() else None))
    disks = DiskImages(enabled=True)
    try:
        disks.create(work, 64, 0)
        used = disk_usage(work)
        disks.detach(work)
    except (OSError, RuntimeFailure) as exc:
        detail = f"a sandbox's disk limit cannot be set: {exc} (or serve with --sandbox-disk-limit off)"
        return PlatformCheck(name="disk limit", ok=False, detail=detail)
    finally:
        with contextlib.suppress(OSError):
            disks.detach(work)  # before the files go: a failure after the mount must not leave it behind
        shutil.rmtree(work, ignore_errors=True)
    size = used.bytes_total >> 20 if used else 0
    return PlatformCheck(name="disk limit", ok=True, detail=f"a 64 MiB sandbox filesystem mounted ({size} MiB usable)")


def _idmap_trial(work: Path) -> str:
    """The launcher's mounts, in a forked child with its own mount namespace; returns "" or what failed."""
    for sub in ("layer", "lower", "upper", "work", "merged"):
        (work / sub).mkdir()
    (work / "layer" / "probe").write_text("")
    base = host_id_base(0)  # slot 0 is never handed to a sandbox
    for sub in ("upper", "work"):
        os.chown(work / sub, base, base)
    options = f"lowerdir={work / 'lower'},upperdir={work / 'upper'},workdir={work / 'work'}"
    userns_fd = create_userns(0)

    def trial() -> str:
        unshare(CLONE_NEWNS)
        make_mounts_private()
        bind_idmapped(str(work / "layer"), str(work / "lower"), userns_fd, read_only=True)
        mount("overlay", str(work / "merged"), "overlay", options)
        owner = os.stat(work / "merged" / "probe").st_uid
        return "" if owner == base else f"a root-owned file shows uid {owner}, not {base}"

    try:
        return _in_child(trial)
    finally:
        os.close(userns_fd)


def _sandbox(
    data_dir: Path, image_cache: Path, executor_source: Path, templates: Mapping[str, Template], built: dict[str, bool]
) -> PlatformCheck:
    name = next((n for n in ("base", *templates) if built.get(n)), None)
    if name is None:
        return PlatformCheck(name="sandbox", ok=True, detail="not tried: no template is built yet", required=False)
    work = Path(tempfile.mkdtemp(prefix="doctor-", dir=data_dir if data_dir.is_dir() else None))
    settings = LocalRuntimeSettings(
        data_dir=work, image_cache=image_cache, executor_source=executor_source, criu_dir=None
    )
    try:
        seconds = asyncio.run(_start_and_stop(settings, msgspec.structs.replace(templates[name], start=(), ports=())))
    except (PoolError, OSError) as exc:
        return PlatformCheck(name="sandbox", ok=False, detail=f"a {name!r} sandbox did not start: {exc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return PlatformCheck(
        name="sandbox", ok=True, detail=f"a {name!r} sandbox started and answered in {seconds * 1000:.0f} ms"
    )


async def _start_and_stop(settings: LocalRuntimeSettings, template: Template) -> float:
    runtime = LocalRuntime(settings, parent_cgroup=f"agent-sandbox-doctor-{os.getpid()}")
    try:
        started = time.monotonic()
        await runtime.start(SandboxSpec(sandbox_id="doctor", template=template, init=ExecutorInit()))
        seconds = time.monotonic() - started
        await runtime.stop("doctor")
        return seconds
    finally:
        runtime.close()


def _criu(criu_dir: Path | None) -> PlatformCheck:
    if criu_dir is None:
        return PlatformCheck(name="criu", ok=False, detail="turned off: snapshots keep files only", required=False)
    status = probe(criu_dir)
    if status.available:
        detail = f"CRIU {status.version} dumped and restored a TCP listener: snapshots keep processes and memory"
    else:
        detail = f"snapshots keep files only: {status.reason.strip().splitlines()[0] if status.reason else '?'}"
    return PlatformCheck(name="criu", ok=status.available, detail=detail, required=False)
