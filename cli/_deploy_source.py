"""What `agent-sandbox deploy` makes of a directory: which kind of app it is, how to serve it, which files it has.

Detection, first match wins: `package.json` with a `start` script, or `server.js` → Node (template
`sandbox-base-node`); `app.py` or `main.py` → Python (`base`); `index.html` → a static site served by
Python's `http.server` (`base`). Every kind gets its port in `PORT`. Sandboxes have no internet, so a Node
app must be dependency-free or ship its `node_modules`, and a Python app may use only the standard library
(or vendor its packages into the directory).

Files are compared by a manifest (relative path → content digest, executable bit, or symlink target), so an
update uploads only what changed; they travel as one gzipped tar, which keeps modes and symlinks.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Literal

import msgspec

from cli._deploy_errors import DeployError

__all__ = ["APP_DIR", "LOG_FILE", "AppPlan", "detect", "pack", "removal_list", "scan"]

APP_DIR = "/home/user/app"  # where the files go in the sandbox (the templates' user is `user`)
LOG_FILE = "/home/user/.config/agent-sandbox/autostart.log"  # the server's stdout and stderr
DEFAULT_PORT = 8080
_SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})
_MAX_BYTES = 1 << 30  # the executor accepts uploads up to 1 GiB

Kind = Literal["static", "node", "python"]


class AppPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How a directory is served: its kind, the template with its runtime, the serving command and port."""

    kind: Kind
    template: str
    serve: str  # what runs in APP_DIR, e.g. `node server.js`
    port: int

    def command(self) -> str:
        """The whole shell command: in the app's directory, with PORT set, output appended to the log."""
        env = f"PORT={self.port} HOST=0.0.0.0 NO_UPDATE_NOTIFIER=1 npm_config_update_notifier=false"
        return f"cd {APP_DIR} && export {env} && exec {self.serve} >> {LOG_FILE} 2>&1"


def detect(directory: Path, port: int | None) -> AppPlan:
    """The plan for `directory`; DeployError when it is not a directory or holds nothing this can serve."""
    if not directory.is_dir():
        raise DeployError(f"{directory} is not a directory")
    port = port or DEFAULT_PORT
    if start := _npm_start(directory / "package.json"):
        return AppPlan(kind="node", template="sandbox-base-node", serve=start, port=port)
    if (directory / "server.js").is_file():
        return AppPlan(kind="node", template="sandbox-base-node", serve="node server.js", port=port)
    for script in ("app.py", "main.py"):
        if (directory / script).is_file():
            return AppPlan(kind="python", template="base", serve=f"python3 {script}", port=port)
    if (directory / "index.html").is_file():
        serve = f"python3 -m http.server {port} --bind 0.0.0.0"
        return AppPlan(kind="static", template="base", serve=serve, port=port)
    raise DeployError(
        f"nothing to deploy in {directory}: expected package.json (with a start script), server.js, app.py, "
        "main.py or index.html"
    )


def _npm_start(package_json: Path) -> str | None:
    """`npm start` when package.json has a start script; None without one (DeployError when unreadable)."""
    if not package_json.is_file():
        return None
    try:
        scripts = json.loads(package_json.read_text()).get("scripts") or {}
    except (OSError, ValueError, AttributeError) as exc:
        raise DeployError(f"{package_json} is not a JSON object: {exc}") from exc
    return "npm start" if isinstance(scripts, dict) and scripts.get("start") else None


def scan(directory: Path) -> dict[str, str]:
    """The manifest: every file and symlink under `directory` (version-control directories left out)."""
    manifest: dict[str, str] = {}
    total = 0
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(root, d)))]:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, directory)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                manifest[relative] = "link:" + os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                total += info.st_size
                manifest[relative] = _digest(path) + ("+x" if info.st_mode & 0o111 else "")
        if total > _MAX_BYTES:
            raise DeployError(f"{directory} holds more than {_MAX_BYTES >> 20} MiB of files: too much to upload")
    return manifest


def _digest(path: str) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


def pack(directory: Path, paths: list[str]) -> bytes:
    """A gzipped tar of `paths` (relative to `directory`), with their modes and symlinks, owned by nobody."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for relative in paths:
            tar.add(directory / relative, arcname=relative, recursive=False, filter=_anonymous)
    return buffer.getvalue()


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def removal_list(paths: list[str]) -> bytes:
    """Paths to delete in the app's directory, NUL-separated for `xargs -0`."""
    return b"".join(os.fsencode(path) + b"\0" for path in paths)
