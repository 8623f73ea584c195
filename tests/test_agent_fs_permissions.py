"""The agent API's `/v1/fs/*` runs with the rights of the user its agents run as (`executor/_agents/_fs_routes.py`).

In a real sandbox of its own (these try to write /etc/passwd), reached on the agent port through the gateway: what
`user` may not do from a shell, an agent's client may not do through `/v1/fs` either (a 403 `permission_denied`
problem, as sandbox-agent answers EACCES), and what it writes is `user`'s, as before.
"""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator

import httpx
import pytest

from executor.agent_api import AGENT_PORT
from tests.executor_fixtures import Envd, executor_in_sandbox
from tests.server_fixtures import RunningServer

OCTETS = {"Content-Type": "application/octet-stream"}


@pytest.fixture(name="own", scope="module")
def own_sandbox_fixture(server: RunningServer) -> Iterator[Envd]:
    with executor_in_sandbox(server) as envd:
        yield envd


@pytest.fixture
def client(own: Envd) -> Iterator[httpx.Client]:
    headers = {"E2b-Sandbox-Id": own.sandbox_id, "E2b-Sandbox-Port": str(AGENT_PORT)}
    headers["Authorization"] = f"Bearer {own.access_token}"
    with httpx.Client(base_url=own.url, headers=headers, timeout=60) as client:
        yield client


def as_root(envd: Envd, command: str) -> str:
    result = envd.sandbox().commands.run(command, user="root")
    assert result.exit_code == 0, result.stderr
    return result.stdout


def assert_denied(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "urn:sandbox-agent:error:permission_denied"
    assert "Permission denied" in problem["detail"]


def test_user_cannot_read_or_list_what_it_may_not(client: httpx.Client) -> None:
    assert_denied(client.get("/v1/fs/file", params={"path": "/etc/shadow"}))
    assert_denied(client.get("/v1/fs/file", params={"path": "../../etc/shadow"}))  # relative to /home/user
    assert_denied(client.get("/v1/fs/entries", params={"path": "/root"}))
    assert_denied(client.get("/v1/fs/stat", params={"path": "/root/.bashrc"}))


def test_user_cannot_write_remove_or_move_system_files(own: Envd, client: httpx.Client) -> None:
    before = as_root(own, "cat /etc/passwd")
    assert_denied(client.put("/v1/fs/file", params={"path": "/etc/passwd"}, content=b"x", headers=OCTETS))
    assert_denied(client.put("/v1/fs/file", params={"path": "/root/.bashrc"}, content=b"pwned", headers=OCTETS))
    assert_denied(client.post("/v1/fs/mkdir", params={"path": "/root/made"}))
    assert_denied(client.delete("/v1/fs/entry", params={"path": "/etc/hostname"}))
    assert_denied(client.post("/v1/fs/move", json={"from": "/etc/hostname", "to": f"/tmp/{uuid.uuid4().hex}"}))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("planted.txt")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    batch = client.post(
        "/v1/fs/upload-batch",
        params={"path": "/etc"},
        content=buffer.getvalue(),
        headers={"Content-Type": "application/x-tar"},
    )
    assert_denied(batch)
    assert as_root(own, "cat /etc/passwd") == before
    assert "pwned" not in as_root(own, "cat /root/.bashrc")
    assert as_root(own, "ls /root/made /etc/planted.txt 2>&1 || true").count("No such file") == 2
    assert as_root(own, "cat /etc/hostname")


def test_what_user_writes_is_its_own_and_another_users_file_keeps_its_owner(own: Envd, client: httpx.Client) -> None:
    directory = f"/home/user/{uuid.uuid4().hex}"
    written = client.put("/v1/fs/file", params={"path": f"{directory}/a/b.txt"}, content=b"mine", headers=OCTETS)
    assert written.json() == {"path": f"{directory}/a/b.txt", "bytesWritten": 4}
    assert as_root(own, f"stat -c %U:%G {directory} {directory}/a {directory}/a/b.txt") == "user:user\n" * 3
    assert client.get("/v1/fs/file", params={"path": f"{directory}/a/b.txt"}).content == b"mine"

    shared = f"/tmp/{uuid.uuid4().hex}"
    as_root(own, f"echo old > {shared} && chmod 666 {shared}")  # root's, which user may write but not chown
    assert client.put("/v1/fs/file", params={"path": shared}, content=b"new", headers=OCTETS).status_code == 200
    assert as_root(own, f"stat -c %U {shared}; cat {shared}") == "root\nnew"
    assert client.delete("/v1/fs/entry", params={"path": directory, "recursive": "true"}).status_code == 200
    as_root(own, f"rm -f {shared}")
