"""CRIU: finding the binary that `scripts/build-criu` installs, and proving that it works on this machine.

The binary is CRIU 4.1.1 built from Debian trixie's tarball, run through a wrapper that preloads a
getsockopt shim (kernels >= 6.16 refuse SO_PASSCRED/SO_PASSSEC on TCP sockets, which CRIU 4.1.x treats as
fatal; `criu-debian.md` §1). `criu check` passing says nothing about that, so `probe` does a real dump and
restore of a process holding a TCP listener. Checkpointing sandboxes is in `_criu_sandbox.py`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from pool._errors import RuntimeFailure

__all__ = ["DEFAULT_CRIU_DIR", "CriuBinary", "CriuStatus", "criu_dir", "find_criu", "log_tail", "probe", "run_criu"]

DEFAULT_CRIU_DIR = Path("/var/cache/agent-sandbox/criu")
_TIMEOUT = 60.0
# The probe's patient: a TCP listener that answers "alive" and then closes, stdio on /dev/null.
_LISTENER = """import os, socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(8)
os.write(1, str(s.getsockname()[1]).encode())
null = os.open("/dev/null", os.O_RDWR); os.dup2(null, 1); os.close(null)
while True:
    c, _ = s.accept(); c.sendall(b"alive"); c.close()
"""


class CriuBinary(msgspec.Struct, frozen=True):
    """The `criu` wrapper (binary + shim) and the version it reports."""

    path: Path
    version: str


class CriuStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What `probe` found: whether checkpoint/restore works here, and if not, why."""

    available: bool
    version: str = ""
    reason: str = ""


def criu_dir() -> Path:
    """Where `scripts/build-criu` installs CRIU (`AGENT_SANDBOX_CRIU_DIR`, default /var/cache/agent-sandbox/criu)."""
    return Path(os.environ.get("AGENT_SANDBOX_CRIU_DIR") or DEFAULT_CRIU_DIR)


def find_criu(directory: Path | None = None) -> CriuBinary:
    """The CRIU in `directory` (default `criu_dir()`); raises RuntimeFailure when it is missing or broken."""
    path = (directory or criu_dir()) / "criu"
    if not os.access(path, os.X_OK):
        raise RuntimeFailure(f"CRIU is not installed at {path} (run scripts/build-criu as root)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeFailure(f"{path} does not run: {exc}") from exc
    found = re.search(r"Version:\s*(\S+)", out)
    if found is None:
        raise RuntimeFailure(f"{path} --version printed no version: {out[-300:]!r}")
    return CriuBinary(path, found.group(1))


def log_tail(log: Path, limit: int = 1500) -> str:
    """The end of a CRIU log, for error messages."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return f"(no log at {log})"
    return text[-limit:].strip()


def run_criu(argv: list[str], log: Path, what: str) -> None:
    """Run a CRIU command that ends by itself; raise RuntimeFailure with its log's tail when it fails."""
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeFailure(f"{what} failed: {exc}\n{log_tail(log)}") from exc
    if result.returncode != 0:
        raise RuntimeFailure(f"{what} failed (exit {result.returncode}): {result.stderr[-500:]}\n{log_tail(log)}")


def probe(directory: Path | None = None) -> CriuStatus:
    """Dump and restore a real process holding a TCP listener, and check it answers afterwards (~0.3 s).

    Needs root. Nothing is cached: every call tries again, so `doctor` and health details tell the truth.
    """
    try:
        criu = find_criu(directory)
    except RuntimeFailure as exc:
        return CriuStatus(available=False, reason=str(exc))
    work = Path(tempfile.mkdtemp(prefix="agent-sandbox-criu-probe-"))
    try:
        _trial(criu, work)
    except (RuntimeFailure, OSError, subprocess.SubprocessError, ValueError) as exc:
        return CriuStatus(available=False, version=criu.version, reason=str(exc) or repr(exc))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return CriuStatus(available=True, version=criu.version)


def _trial(criu: CriuBinary, work: Path) -> None:
    listener = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _LISTENER],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    restorer: subprocess.Popen[bytes] | None = None
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.read() or b"0")
        listener.stdout.close()
        if not port:
            raise RuntimeFailure("the probe's listener did not start")
        run_criu([str(criu.path), "dump", "-t", str(listener.pid), "-D", str(work), "-o", "dump.log"],
                 work / "dump.log", "criu dump of a TCP listener")  # fmt: skip
        listener.wait(5)  # CRIU killed it; its pid must be free for the restore
        # Without --restore-detached criu stays the parent of what it restored and reaps it when we kill it.
        restorer = subprocess.Popen(
            [str(criu.path), "restore", "-D", str(work), "-o", "restore.log"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        if _ask(port, restorer) != b"alive":
            raise RuntimeFailure(f"the restored listener did not answer\n{log_tail(work / 'restore.log')}")
    finally:
        if restorer is not None:
            _stop_restored(restorer, listener.pid)
        if listener.poll() is None:
            listener.kill()
        listener.wait(5)


def _stop_restored(restorer: subprocess.Popen[bytes], pid: int) -> None:
    """Kill the restored listener (same pid as before, a child of criu) and let criu reap it and exit."""
    try:
        if restorer.poll() is None and _parent_of(pid) == restorer.pid:
            os.kill(pid, 9)
        restorer.wait(5)
    except (OSError, subprocess.TimeoutExpired):
        restorer.kill()
        restorer.wait()


def _parent_of(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rpartition(")")[2].split()[1])


def _ask(port: int, restorer: subprocess.Popen[bytes], timeout: float = 5.0) -> bytes:
    """Connect until the restored listener is there (criu restore is still running meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                return conn.recv(16)
        except OSError:
            if restorer.poll() is not None:
                return b""
            time.sleep(0.002)
    return b""
