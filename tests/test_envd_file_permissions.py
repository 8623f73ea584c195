"""File operations through envd run with the rights of the user they name, and a rejected upload leaves nothing.

The audit's attacks (security-audit.md, "/files and SDK file calls as user run with root's rights", "2 GiB upload
to /files, chunked"), replayed with the real e2b SDK against a real sandbox of its own (they try to write
/etc/passwd: the session's shared sandbox must not be the one bricked if they ever succeed again). What `user` may
not do from a shell it may not do through the API either, and the SDK says so with its own error; root still may.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
from e2b import FileType, InvalidArgumentException, SandboxException

from tests.executor_fixtures import Envd, executor_in_sandbox, run_executor
from tests.server_fixtures import RunningServer

LIMIT = 1024**3  # the executor's default max_upload_bytes, as the audit met it


@pytest.fixture(name="own", scope="module")
def own_sandbox_fixture(server: RunningServer) -> Iterator[Envd]:
    with executor_in_sandbox(server) as envd:
        yield envd


def as_root(envd: Envd, command: str) -> str:
    result = envd.sandbox().commands.run(command, user="root")
    assert result.exit_code == 0, result.stderr
    return result.stdout


def assert_denied(action: Callable[[], object]) -> None:
    """The SDK's error for envd's 403 / `permission_denied` (it has no class of its own: not NotFound, not auth)."""
    with pytest.raises(SandboxException) as caught:
        action()
    assert type(caught.value) is SandboxException
    assert "403" in str(caught.value) or "PERMISSION_DENIED" in str(caught.value)
    assert "Permission denied" in str(caught.value) or "Operation not permitted" in str(caught.value)


def test_user_cannot_read_etc_shadow(own: Envd) -> None:
    files = own.sandbox().files
    assert_denied(lambda: files.read("/etc/shadow", user="user"))
    assert_denied(lambda: files.read("../../etc/shadow", user="user"))  # relative to /home/user
    assert "root:" in files.read("/etc/shadow", user="root")


def test_user_cannot_write_etc_passwd_and_it_is_unchanged(own: Envd) -> None:
    files = own.sandbox().files
    before = files.read("/etc/passwd", user="root")
    assert_denied(lambda: files.write("/etc/passwd", "user::0:0::/root:/bin/sh\n", user="user"))
    assert_denied(lambda: files.write_files([{"path": "/etc/passwd", "data": "x"}], user="user"))
    assert files.read("/etc/passwd", user="root") == before
    assert as_root(own, "ls -A /etc | grep -c '[.]upload$' || true").strip() == "0"  # no temporary file either


def test_user_cannot_write_or_list_roots_home(own: Envd) -> None:
    files = own.sandbox().files
    assert_denied(lambda: files.write("/root/.bashrc", "echo pwned", user="user"))
    assert_denied(lambda: files.list("/root", user="user"))
    assert_denied(lambda: files.get_info("/root/.bashrc", user="user"))
    assert_denied(lambda: files.make_dir("/root/made", user="user"))
    assert "pwned" not in as_root(own, "cat /root/.bashrc")
    assert ".bashrc" in [entry.name for entry in files.list("/root", user="root")]


def test_user_cannot_remove_or_move_system_files(own: Envd) -> None:
    files = own.sandbox().files
    assert_denied(lambda: files.remove("/etc/hostname", user="user"))
    assert_denied(lambda: files.rename("/etc/hostname", "/tmp/hostname", user="user"))
    assert files.exists("/etc/hostname", user="root")


def test_symlinks_and_proc_1_root_do_not_lend_roots_rights(own: Envd) -> None:
    files = own.sandbox().files
    name = uuid.uuid4().hex
    as_root(
        own,
        f"ln -s /etc/shadow /tmp/{name}-shadow && ln -s /etc/passwd /tmp/{name}-passwd && ln -s /root /tmp/{name}-root",
    )
    before = files.read("/etc/passwd", user="root")
    assert_denied(lambda: files.read(f"/tmp/{name}-shadow", user="user"))
    assert_denied(lambda: files.write(f"/tmp/{name}-passwd", "x", user="user"))
    assert_denied(lambda: files.list(f"/tmp/{name}-root", user="user"))
    assert_denied(lambda: files.read("/proc/1/root/etc/shadow", user="user"))
    assert_denied(lambda: files.read("/proc/1/root/etc/hostname", user="user"))  # readable, but not through pid 1
    assert_denied(lambda: files.read("/proc/1/environ", user="user"))
    assert_denied(lambda: files.list("/proc/1/root", user="user"))
    assert_denied(lambda: files.watch_dir("/root", user="user"))
    assert files.read("/etc/passwd", user="root") == before
    assert files.read("/proc/1/root/etc/hostname", user="root")


def test_user_still_works_in_its_home_and_tmp(own: Envd) -> None:
    files = own.sandbox().files
    name = uuid.uuid4().hex
    for directory in ("/home/user", "/tmp"):
        written = files.write(f"{directory}/{name}/a/b.txt", "mine", user="user")
        assert files.read(written.path, user="user") == "mine"
        info = files.get_info(f"{directory}/{name}/a", user="user")
        assert (info.owner, info.group, info.type) == ("user", "user", FileType.DIR)
        assert files.get_info(written.path, user="user").owner == "user"
        files.rename(written.path, f"{directory}/{name}/c.txt", user="user")
        assert [entry.name for entry in files.list(f"{directory}/{name}", user="user")] == ["a", "c.txt"]
        files.remove(f"{directory}/{name}", user="user")
        assert not files.exists(f"{directory}/{name}", user="user")


def test_supplementary_groups_count_as_in_a_shell(own: Envd) -> None:
    files = own.sandbox().files
    group = "g" + uuid.uuid4().hex[:8]
    as_root(own, f"groupadd {group} && mkdir -p /srv/{group} && echo shared > /srv/{group}/f")
    as_root(own, f"chgrp -R {group} /srv/{group} && chmod 750 /srv/{group} && chmod 640 /srv/{group}/f")
    assert_denied(lambda: files.read(f"/srv/{group}/f", user="user"))
    as_root(own, f"usermod -aG {group} user")
    assert files.read(f"/srv/{group}/f", user="user") == "shared\n"
    assert as_root(own, f"su user -c 'cat /srv/{group}/f'") == "shared\n"  # what a shell of the user sees


def test_user_may_write_but_not_replace_roots_world_writable_file_in_tmp(own: Envd) -> None:
    """/tmp is sticky: `user` cannot rename over root's file there, but may write it, as a shell's `>` does."""
    files = own.sandbox().files
    path = f"/tmp/{uuid.uuid4().hex}"
    as_root(own, f"echo old > {path} && chmod 666 {path}")
    files.write(path, "new", metadata={"k": "v"}, user="user")
    info = files.get_info(path, user="user")
    assert (files.read(path, user="user"), info.owner, info.metadata) == ("new", "root", {"k": "v"})
    assert as_root(own, "ls -A /tmp | grep -c '[.]upload$' || true").strip() == "0"


def test_proc_self_is_the_users_own_process(own: Envd) -> None:
    """As `user`, /proc/self is that user's helper, not the executor: its fd 0 is a socket, which cannot be opened."""
    files = own.sandbox().files
    with pytest.raises(InvalidArgumentException, match="No such device or address"):
        files.read("/proc/self/fd/0", user="user")
    assert "AGENT_SANDBOX_EXECUTOR_HELPER=1" in files.read("/proc/self/environ", user="user")


def test_a_helper_the_user_killed_is_replaced(own: Envd) -> None:
    """The user may kill its own helper process (it is a process of that user's): the next call starts another."""
    sandbox = own.sandbox()
    sandbox.files.write("/tmp/helper-test.txt", "alive", user="user")
    killed = sandbox.commands.run("pkill -KILL -u user -f '[e]xecutor[.]_fs_worker' && echo killed", user="user")
    assert killed.stdout == "killed\n"
    assert sandbox.files.read("/tmp/helper-test.txt", user="user") == "alive"


@pytest.mark.anyio
async def test_concurrent_calls_of_one_user_all_succeed(own: Envd) -> None:
    sandbox = own.async_sandbox()
    paths = [f"/tmp/{uuid.uuid4().hex}" for _ in range(12)]
    await asyncio.gather(*(sandbox.files.write(path, path, user="user") for path in paths))
    assert await asyncio.gather(*(sandbox.files.read(path, user="user") for path in paths)) == paths


def test_root_can_still_do_everything(own: Envd) -> None:
    files = own.sandbox().files
    name = uuid.uuid4().hex
    files.write(f"/root/{name}.txt", "root's", user="root")
    assert files.get_info(f"/root/{name}.txt", user="root").owner == "root"
    files.write(f"/etc/{name}.conf", "x", user="root")
    files.remove(f"/etc/{name}.conf", user="root")
    files.remove(f"/root/{name}.txt", user="root")
    assert not files.exists(f"/etc/{name}.conf", user="root")


def _chunks(size: int) -> Iterator[bytes]:
    block = bytes(1024 * 1024)
    for _ in range(size // len(block)):
        yield block


def test_a_chunked_upload_over_the_limit_leaves_no_file_and_the_old_one_survives(own: Envd) -> None:
    """The audit's 2 GiB chunked upload kept 1 GiB on disk; now the 413 leaves the destination as it was."""
    files = own.sandbox().files
    name = uuid.uuid4().hex
    files.write(f"/home/user/{name}-old", "old content", user="user")
    with own.client() as client:
        for path in (f"/home/user/{name}-new", f"/home/user/{name}-old"):
            params = {"path": path, "username": "user"}
            headers = {"Content-Type": "application/octet-stream"}
            response = client.post("/files", params=params, headers=headers, content=_chunks(LIMIT + (2 << 20)))
            assert response.status_code == 413
            assert response.json() == {"code": 413, "message": f"upload is larger than the limit of {LIMIT} bytes"}
    assert not files.exists(f"/home/user/{name}-new", user="user")
    assert files.read(f"/home/user/{name}-old", user="user") == "old content"
    assert as_root(own, "ls -A /home/user | grep -c '[.]upload$' || true").strip() == "0"
    files.remove(f"/home/user/{name}-old", user="user")


def test_an_upload_cut_short_leaves_the_old_file(own: Envd) -> None:
    files = own.sandbox().files
    path = f"/home/user/{uuid.uuid4().hex}/kept.txt"
    files.write(path, "old content", user="user")
    body = b'--b\r\nContent-Disposition: form-data; name="file"; filename="kept.txt"\r\n\r\nnew content, no end'
    with own.client() as client:
        response = client.post(
            "/files",
            params={"path": path, "username": "user"},
            headers={"Content-Type": "multipart/form-data; boundary=b"},
            content=body,
        )
    assert response.status_code == 400
    assert files.read(path, user="user") == "old content"
    assert [entry.name for entry in files.list(path.rsplit("/", 1)[0], user="user")] == ["kept.txt"]


def test_an_upload_keeps_the_old_files_mode_and_takes_the_writers_ownership() -> None:
    with run_executor() as envd:
        files = envd.sandbox().files
        directory = f"/tmp/{uuid.uuid4().hex}"
        files.write(f"{directory}/script.sh", "#!/bin/sh\n")
        envd.sandbox().commands.run(f"chmod 750 {directory}/script.sh")
        files.write(f"{directory}/script.sh", "#!/bin/sh\necho new\n")
        assert files.get_info(f"{directory}/script.sh").permissions == "-rwxr-x---"
        assert [entry.name for entry in files.list(directory)] == ["script.sh"]
        files.remove(directory)


def test_a_failed_upload_removes_the_directories_it_made() -> None:
    with (
        run_executor("--max-upload-bytes", "1000") as envd,
        httpx.Client(base_url=envd.url, headers=envd.headers()) as client,
    ):
        directory = f"/tmp/{uuid.uuid4().hex}"
        params = {"path": f"{directory}/made/for/it.bin"}
        headers = {"Content-Type": "application/octet-stream"}
        response = client.post("/files", params=params, headers=headers, content=iter([bytes(600), bytes(600)]))
        assert response.status_code == 413
        assert not envd.sandbox().files.exists(directory)
