"""The data directory and the state database are the server's alone, even when an older server made them wider.

The records hold every sandbox's envd and traffic tokens in clear (docs/security.md, "State on disk"): the audit
read one out of a 0644 `state.db` as `nobody` and used it through the gateway.
"""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import httpx

from tests.server_fixtures import running_server


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_serve_makes_a_wide_data_dir_0700_and_its_files_0600(tmp_path: Path) -> None:
    """A database, WAL files and a stale API-key file of 0644 in a 0755 directory, as the audit found them."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    sqlite3.connect(data_dir / "state.db").close()
    files = [data_dir / name for name in ("state.db", "state.db-wal", "state.db-shm", "api-key")]
    for path in files:
        path.touch()
        path.chmod(0o644)
    with running_server(data_dir) as server:
        answer = httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-Key": server.api_key})
        assert answer.status_code == 200  # the store answers: the database is open, the new key is in it
        assert mode(data_dir) == 0o700
        assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}
