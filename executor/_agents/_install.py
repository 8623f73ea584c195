"""`POST /v1/agents/{agent}/install`: npm puts an agent's pinned packages in `<agents dir>/<agent>`.

`npm install --global --prefix <agents dir>/<agent>.installing <packages>`, then the directory takes the
agent's place, so a failed reinstall leaves the old one working. Their commands land in `<dir>/bin`,
which the catalog searches before the sandbox's PATH. `agentProcessVersion` replaces the version of the
ACP adapter (the first package), `agentVersion` that of the agent's CLI (the last; with one package
both name it and must agree). npm runs as root with the sandbox's environment and PATH (its proxy and
registry settings included), for at most `INSTALL_SECONDS`; one install per agent at a time. It is a process
of the executor's table (envd lists it), whose reaper collects its exit status.

Answers are upstream's: `{already_installed, artifacts}`, or 500 `install_failed` with npm's stderr
tail in `details.stderr` (no npm here, no way to the registry, a version that does not exist).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal

from executor._agents._catalog import MOCK_PATH, AgentKind, resolve
from executor._agents._launch import Launcher
from executor._process_env import environment
from executor._processes import Exit, ProcessTable
from executor._spawn import Spec
from executor._users import lookup
from executor.agent_api import InstallArtifact, InstallRequest, InstallResponse

__all__ = ("INSTALL_SECONDS", "InstallFailed", "Installer")

INSTALL_SECONDS = 600.0
STDERR_TAIL_BYTES = 8192
VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")


class InstallFailed(Exception):
    """npm could not install the agent; `stderr` is the tail of what it said."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


class Installer:
    def __init__(self, launcher: Launcher, table: ProcessTable) -> None:
        self._launcher = launcher
        self._table = table
        self._locks: dict[str, asyncio.Lock] = {}

    async def install(self, kind: AgentKind, request: InstallRequest) -> InstallResponse:
        """Install `kind` unless it is installed already (or `request.reinstall`); ValueError for a bad version."""
        if kind.id == "mock":
            return InstallResponse(True, [InstallArtifact("agent_process", MOCK_PATH, "builtin", "builtin")])
        if kind.unavailable is not None:
            raise InstallFailed(f"{kind.id} cannot be installed here: {kind.unavailable}")
        packages = _packages(kind, request)
        async with self._locks.setdefault(kind.id, asyncio.Lock()):
            if not request.reinstall and resolve(kind, self._launcher.search_path(kind.id)) is not None:
                return InstallResponse(True, self._artifacts(kind, kind.packages))
            await self._npm(kind, packages)
        return InstallResponse(False, self._artifacts(kind, packages))

    async def _npm(self, kind: AgentKind, packages: tuple[str, ...]) -> None:
        path_env = self._launcher.path_env
        npm = shutil.which("npm", path=path_env)
        if npm is None:
            raise InstallFailed(
                f"npm is not on this sandbox's PATH ({path_env}): use a template with Node.js and npm, "
                "or install the agent in the template"
            )
        target = os.path.join(self._launcher.agents_dir, kind.id)
        staging = f"{target}.installing"
        await asyncio.to_thread(os.makedirs, self._launcher.agents_dir, 0o755, True)
        await asyncio.to_thread(_clear, staging)
        env = environment(self._launcher.defaults, path_env, lookup("root"), {})
        argv = [npm, "install", "--global", "--prefix", staging, "--no-audit", "--no-fund", "--loglevel=error"]
        spec = Spec(argv=[*argv, *packages], env=env, cwd="/", user=lookup("root"), tag=f"install-{kind.id}")
        exit_code, tail = await self._run(spec)
        if exit_code is None:
            await asyncio.to_thread(_clear, staging)
            raise InstallFailed(f"npm install of {' '.join(packages)} ran past {INSTALL_SECONDS:.0f} s", tail)
        if exit_code != 0:
            await asyncio.to_thread(_clear, staging)
            raise InstallFailed(f"npm install of {' '.join(packages)} failed (exit {exit_code})", tail)
        await asyncio.to_thread(_replace, staging, target)
        if resolve(kind, self._launcher.search_path(kind.id)) is None:
            missing = ", ".join(kind.commands)
            raise InstallFailed(f"npm installed {' '.join(packages)} but {missing} did not appear", tail)

    async def _run(self, spec: Spec) -> tuple[int | None, str]:
        """npm's exit code (None past `INSTALL_SECONDS`) and its stderr tail; run through the executor's process
        table, whose reaper is the one that collects every child's exit status."""
        process = self._table.start(spec)
        subscription = process.subscribe()
        stderr = bytearray()
        try:
            async with asyncio.timeout(INSTALL_SECONDS):
                while True:
                    item = await subscription.next()
                    if isinstance(item, Exit):
                        return item.exit_code, _tail(stderr)
                    if item.stream == "stderr":
                        stderr += item.data
                        del stderr[:-STDERR_TAIL_BYTES]
        except TimeoutError:
            process.signal(signal.SIGKILL)
            return None, _tail(stderr)
        finally:
            subscription.close()

    def _artifacts(self, kind: AgentKind, packages: tuple[str, ...]) -> list[InstallArtifact]:
        search = self._launcher.search_path(kind.id)
        artifacts = []
        for index, (command, package) in enumerate(zip(kind.commands, packages, strict=False)):
            name, _, version = package.rpartition("@")
            path = shutil.which(command, path=search) or ""
            role = "agent_process" if index == 0 else "native_agent"
            artifacts.append(InstallArtifact(role, path, f"npm:{name}", version or None))
        return artifacts


def _packages(kind: AgentKind, request: InstallRequest) -> tuple[str, ...]:
    """The packages with the versions the request names (ValueError for a version npm could misread)."""
    packages = list(kind.packages)
    wanted = [(0, request.agent_process_version), (len(packages) - 1, request.agent_version)]
    chosen: dict[int, str] = {}
    for index, version in wanted:
        if version is None:
            continue
        if not VERSION.fullmatch(version):
            raise ValueError(f"invalid version {version!r}: use an npm version such as 1.2.3")
        if chosen.get(index, version) != version:
            raise ValueError(f"{kind.id} has one package: agentVersion and agentProcessVersion must agree")
        chosen[index] = version
    for index, version in chosen.items():
        name = packages[index].rpartition("@")[0]
        packages[index] = f"{name}@{version}"
    return tuple(packages)


def _tail(stderr: bytearray) -> str:
    return bytes(stderr[-STDERR_TAIL_BYTES:]).decode("utf-8", "replace")


def _clear(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _replace(staging: str, target: str) -> None:
    """`staging` takes `target`'s place (the old one removed only once the new one is complete)."""
    old = f"{target}.old"
    _clear(old)
    if os.path.lexists(target):
        os.rename(target, old)
    os.rename(staging, target)
    _clear(old)
