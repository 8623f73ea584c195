"""GET/PUT /agent-sandbox/archive: the working directory as a tar.gz, and restoring it, safely and within a limit."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from executor import Defaults
from executor._archive import Archives
from pool._errors import RuntimeFailure
from pool._executor_client import download_archive, freeze, thaw, upload_archive
from tests.executor_fixtures import Envd, run_executor

pytestmark = pytest.mark.anyio

ARCHIVE = "/agent-sandbox/archive"
OLD = 1_000_000_000  # an mtime in 2001


@contextlib.contextmanager
def _executor_in(directory: Path, *arguments: str) -> Iterator[Envd]:
    """An executor whose default workdir is `directory`."""
    with run_executor(*arguments) as running, running.client() as client:
        assert client.post("/init", json={"defaultWorkdir": str(directory)}).status_code == 204
        yield running


def _populate(root: Path) -> None:
    """Files with odd modes and owners, links, an empty directory and a nested file."""
    (root / "bin").mkdir(parents=True)
    (root / "notes.txt").write_text("hello")
    (root / "notes.txt").chmod(0o640)
    os.chown(root / "notes.txt", 1234, 5678)
    (root / "bin" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "bin" / "run.sh").chmod(0o755)
    os.link(root / "notes.txt", root / "hard.txt")
    (root / "link").symlink_to("notes.txt")
    (root / "python").symlink_to("/usr/bin/python3")  # out of the directory: stored as a link, not followed
    (root / "empty").mkdir(mode=0o700)
    (root / "deep" / "a" / "b").mkdir(parents=True)
    (root / "deep" / "a" / "b" / "c.bin").write_bytes(os.urandom(1000))
    for path in [*root.rglob("*"), root]:
        os.utime(path, (OLD, OLD), follow_symlinks=False)


def _snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """What a restore must reproduce, by relative path (symbolic links: no mode, no mtime)."""
    seen: dict[str, tuple[object, ...]] = {}
    for path in [root, *sorted(root.rglob("*"))]:
        status = path.lstat()
        name = str(path.relative_to(root))
        if path.is_symlink():
            seen[name] = ("link", os.readlink(path), status.st_uid, status.st_gid)
        elif path.is_dir():
            seen[name] = ("dir", status.st_mode, status.st_uid, status.st_gid, int(status.st_mtime))
        else:
            content = path.read_bytes()
            seen[name] = ("file", content, status.st_mode, status.st_uid, status.st_gid, int(status.st_mtime))
    return seen


def _tar_gz(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def test_round_trip_restores_contents_modes_owners_times_links_and_empty_dirs(tmp_path: Path) -> None:
    source, target, outside = tmp_path / "source", tmp_path / "target", tmp_path / "outside.txt"
    _populate(source)
    target.mkdir()
    outside.write_text("keep")
    (target / "notes.txt").symlink_to(outside)  # in the way: replaced, never written through
    with _executor_in(source) as first, first.client() as client:
        response = client.get(ARCHIVE)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/gzip"
    assert response.headers["x-archive-root"] == str(source)
    assert int(response.headers["content-length"]) == len(response.content)
    with _executor_in(target) as second, second.client() as client:
        assert client.put(ARCHIVE, content=response.content).status_code == 204
    assert _snapshot(target) == _snapshot(source)
    assert (target / "hard.txt").stat().st_ino == (target / "notes.txt").stat().st_ino
    assert outside.read_text() == "keep"


@pytest.mark.parametrize(
    "members",
    [
        pytest.param([_member("../escape.txt")], id="dot-dot"),
        pytest.param([_member("/tmp/agent-sandbox-absolute-member.txt")], id="absolute"),
        pytest.param([_member("link", tarfile.SYMTYPE, "../outside"), _member("link/escape.txt")], id="through-link"),
        pytest.param([_member("hard", tarfile.LNKTYPE, "../outside/secret.txt")], id="hard-link-out"),
        pytest.param([_member("disk", tarfile.BLKTYPE)], id="device"),
    ],
)
def test_malicious_archives_are_refused_and_write_nothing(tmp_path: Path, members: list[tarfile.TarInfo]) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    body = _tar_gz((_member("innocent.txt"), b"first"), *((member, b"x") for member in members))
    with _executor_in(work) as running, running.client() as client:
        response = client.put(ARCHIVE, content=body)
    assert response.status_code == 400
    assert response.json()["code"] == 400
    assert list(work.iterdir()) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["outside", "work"]
    assert [path.name for path in outside.iterdir()] == ["secret.txt"]
    assert not Path("/tmp/agent-sandbox-absolute-member.txt").exists()


def test_a_member_below_a_link_already_on_disk_is_refused(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "sub").symlink_to(outside)  # the archive names no "sub" of its own to replace it with
    with _executor_in(work) as running, running.client() as client:
        response = client.put(ARCHIVE, content=_tar_gz((_member("sub/escape.txt"), b"x")))
    assert (response.status_code, response.json()["code"]) == (400, 400)
    assert list(outside.iterdir()) == []


def test_a_body_that_is_no_tar_gz_is_refused(tmp_path: Path) -> None:
    with _executor_in(tmp_path) as running, running.client() as client:
        response = client.put(ARCHIVE, content=b"not a gzip stream")
    assert (response.status_code, response.json()["code"]) == (400, 400)


def test_archives_over_the_limit_get_413_both_ways(tmp_path: Path) -> None:
    (tmp_path / "random.bin").write_bytes(os.urandom(10_000))
    with _executor_in(tmp_path, "--max-archive-bytes", "2000") as running, running.client() as client:
        download = client.get(ARCHIVE)
        upload = client.put(ARCHIVE, content=os.urandom(5000))
    assert (download.status_code, download.json()["code"]) == (413, 413)
    assert (upload.status_code, upload.json()["code"]) == (413, 413)
    assert "2000" in upload.json()["message"]


def test_archive_endpoints_refuse_a_wrong_token(tmp_path: Path) -> None:
    with _executor_in(tmp_path) as running, running.client(**{"X-Access-Token": "wrong"}) as client:
        responses = [client.get(ARCHIVE), client.put(ARCHIVE, content=_tar_gz())]
    assert [(response.status_code, response.json()["code"]) for response in responses] == [(401, 401)] * 2


def test_without_a_workdir_the_current_directory_is_archived() -> None:
    assert Archives(Defaults(user="root"), 1).root() == os.getcwd()


def _connect(envd: Envd) -> socket.socket:
    address = urlsplit(envd.url)
    return socket.create_connection((address.hostname or "", address.port or 80))


async def test_pool_client_freezes_downloads_thaws_and_uploads_over_a_socket(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    _populate(source)
    (source / "big.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # incompressible: a multi-MiB body each way

    async def scenario(first: Envd, second: Envd) -> bytes:
        await freeze(_connect(first), first.access_token)
        archive = await download_archive(_connect(first), first.access_token, limit=16 * 1024 * 1024)
        await thaw(_connect(first), first.access_token)
        await upload_archive(_connect(second), second.access_token, archive)
        with pytest.raises(RuntimeFailure, match="401"):
            await freeze(_connect(first), "wrong")
        with pytest.raises(RuntimeFailure):
            await download_archive(_connect(first), first.access_token, limit=1024)
        return archive

    with _executor_in(source) as first, _executor_in(target) as second:
        archive = await scenario(first, second)
        with first.client() as client:
            assert client.get("/agent-sandbox/freeze").json() == {"frozen": False, "stopped": 0}
    assert len(archive) > 3 * 1024 * 1024
    assert _snapshot(target) == _snapshot(source)
