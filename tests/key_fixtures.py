"""`agent-sandbox keys ...` run against a running server's data directory, as an operator runs it."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.server_fixtures import REPO, RunningServer

__all__ = ["create_key", "keys_command"]


def keys_command(server: RunningServer, *args: str) -> str:
    """The output of `agent-sandbox keys <args>` on the server's data directory (which must succeed)."""
    argv = [sys.executable, "-m", "cli", "keys", *args, "--data-dir", str(server.data_dir)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def create_key(server: RunningServer, *flags: str) -> tuple[str, str]:
    """A new key of the server, created with `flags` (`--max-sandboxes 2`, ...): (the key, its id)."""
    printed = keys_command(server, "create", *flags)
    found = re.fullmatch(r"(e2b_[0-9a-f]{32})\n\(id ([0-9a-f]+);.*\n", printed)
    assert found is not None, printed
    return found.group(1), found.group(2)
