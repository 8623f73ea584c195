"""E2B's snapshots with memory with the real `e2b` SDK: `create_snapshot(mode="full")` keeps a running sandbox's
memory and files, and every `Sandbox.create(<snapshot id>)` goes on from them (a counter's count, its server's
pid), each on its own, also once the source is gone and after the server restarts; `delete_snapshot` removes the
image. No mode is E2B's default: memory where it can be imaged. Needs CRIU (`require_criu`): nothing else is a
snapshot with memory."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxException, Volume

from tests.runtime_fixtures import require_criu
from tests.server_fixtures import RunningServer, running_server
from tests.test_e2b_sdk_fork import NOTE, _counter, _start_counter


@pytest.fixture(autouse=True)
def _criu() -> None:
    require_criu()


def _memory_images(server: RunningServer) -> list[str]:
    images = server.data_dir / "memory-images"
    return sorted(os.listdir(images)) if images.is_dir() else []


def test_sandboxes_created_from_a_snapshot_with_memory_go_on_from_it(sbx: Sandbox, e2b_env: RunningServer) -> None:
    _start_counter(sbx)
    sbx.files.write(NOTE, "before the snapshot")
    count, pid = _counter(sbx, e2b_env)
    before = _memory_images(e2b_env)

    snapshot = sbx.create_snapshot(f"mem-{uuid.uuid4().hex[:8]}", mode="full")

    assert len(_memory_images(e2b_env)) == len(before) + 1
    one, two = Sandbox.create(snapshot.snapshot_id), Sandbox.create(snapshot.snapshot_id)
    try:
        assert _counter(one, e2b_env) == (count + 1, pid)  # its memory is the snapshot's
        assert _counter(one, e2b_env) == (count + 2, pid)
        assert _counter(two, e2b_env) == (count + 1, pid)  # each counts on its own
        assert _counter(sbx, e2b_env) == (count + 1, pid)  # and the source ran on
        one.files.write(NOTE, "the first copy's")
        assert two.files.read(NOTE) == "before the snapshot"
        assert one.commands.run(f"stat -c %U {NOTE}; id -un").stdout.split() == ["user", "user"]
        assert one._envd_access_token != sbx._envd_access_token
        sbx.kill()
        three = Sandbox.create(snapshot.snapshot_id)  # the source is gone: the image is the snapshot's own
        assert _counter(three, e2b_env) == (count + 1, pid)
        three.kill()
    finally:
        one.kill()
        two.kill()
    assert Sandbox.delete_snapshot(snapshot.snapshot_id)
    assert _memory_images(e2b_env) == before
    with pytest.raises(SandboxException, match="404: template"):
        Sandbox.create(snapshot.snapshot_id)


def test_no_mode_keeps_the_memory_as_e2b_does_and_filesystem_the_files_only(
    sbx: Sandbox, e2b_env: RunningServer
) -> None:
    _start_counter(sbx)
    count, pid = _counter(sbx, e2b_env)
    before = _memory_images(e2b_env)
    default, files = sbx.create_snapshot(), sbx.create_snapshot(mode="filesystem")
    assert len(_memory_images(e2b_env)) == len(before) + 1
    with_memory, files_only = Sandbox.create(default.snapshot_id), Sandbox.create(files.snapshot_id)
    try:
        assert _counter(with_memory, e2b_env) == (count + 1, pid)
        assert files_only.commands.run("pgrep -f 'counter[.]py' || echo none").stdout == "none\n"
    finally:
        with_memory.kill()
        files_only.kill()
        Sandbox.delete_snapshot(default.snapshot_id)
        Sandbox.delete_snapshot(files.snapshot_id)
    assert _memory_images(e2b_env) == before


def test_a_sandbox_with_a_volume_is_not_snapshotted_with_its_memory(e2b_env: RunningServer) -> None:
    volume = Volume.create(f"mem-{uuid.uuid4().hex[:8]}")
    sandbox = Sandbox.create(volume_mounts={"/mnt/data": volume})
    try:
        with pytest.raises(SandboxException, match="501: a sandbox with volumes is not snapshotted with its memory"):
            sandbox.create_snapshot(mode="full")
        before = _memory_images(e2b_env)
        assert Sandbox.delete_snapshot(sandbox.create_snapshot().snapshot_id)  # no mode: files, as memory cannot be
        assert _memory_images(e2b_env) == before
    finally:
        sandbox.kill()
        Volume.destroy(volume.volume_id)


def test_a_snapshot_with_memory_outlives_a_server_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "data"
    with running_server(data_dir) as server:
        for name, value in server.e2b_env().items():
            monkeypatch.setenv(name, value)
        source = Sandbox.create()
        _start_counter(source)
        count, pid = _counter(source, server)
        snapshot = source.create_snapshot("kept-over-restart", mode="full")
        [kept] = _memory_images(server)
    unnamed = data_dir / "memory-images" / ("0" * 32)  # what a crash before the snapshot's record leaves
    shutil.copytree(data_dir / "memory-images" / kept, unnamed, symlinks=True)
    with running_server(data_dir) as server:
        assert _memory_images(server) == [kept]  # the unnamed one went at the start
        for name, value in server.e2b_env().items():
            monkeypatch.setenv(name, value)
        copy = Sandbox.create(snapshot.snapshot_id)
        try:
            assert _counter(copy, server) == (count + 1, pid)
        finally:
            copy.kill()


def test_what_is_made_from_a_copy_is_its_own(sbx: Sandbox, e2b_env: RunningServer) -> None:
    """A files-only snapshot of a sandbox restored from a memory snapshot is files only (and its deletion leaves
    the memory snapshot whole); an insecure create from a secure sandbox's snapshot has no token; volumes are
    refused."""
    _start_counter(sbx)
    count, pid = _counter(sbx, e2b_env)
    memory = sbx.create_snapshot(mode="full")
    insecure = httpx.post(
        f"{e2b_env.url}/v2/sandboxes",
        json={"templateID": memory.snapshot_id, "secure": False},
        headers={"X-API-Key": e2b_env.api_key},
    )  # the SDK always asks for a secure one
    assert insecure.status_code == 201, insecure.text
    tokenless = Sandbox.connect(insecure.json()["sandboxID"])
    try:
        assert tokenless._envd_access_token is None
        assert tokenless.commands.run("echo no token").stdout == "no token\n"  # the source's token was taken away
    finally:
        tokenless.kill()
    copy = Sandbox.create(memory.snapshot_id)
    try:
        copy.files.write(NOTE, "the copy's")
        files = copy.create_snapshot(mode="filesystem")
        fresh = Sandbox.create(files.snapshot_id)
        try:
            assert fresh.files.read(NOTE) == "the copy's"
            assert fresh.commands.run("pgrep -f 'counter[.]py' || echo none").stdout == "none\n"
        finally:
            fresh.kill()
        assert Sandbox.delete_snapshot(files.snapshot_id)
        again = Sandbox.create(memory.snapshot_id)
        assert _counter(again, e2b_env) == (count + 1, pid)  # the memory image is whole
        again.kill()
        volume = Volume.create(f"mem-{uuid.uuid4().hex[:8]}")
        try:
            with pytest.raises(SandboxException, match="501: a sandbox created from a snapshot with memory mounts"):
                Sandbox.create(memory.snapshot_id, volume_mounts={"/mnt/data": volume})
        finally:
            Volume.destroy(volume.volume_id)
    finally:
        copy.kill()
        Sandbox.delete_snapshot(memory.snapshot_id)


def test_a_memory_image_counts_in_the_keys_snapshot_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_server(tmp_path / "data", "--key-max-snapshot-mb", "1") as server:
        for name, value in server.e2b_env().items():
            monkeypatch.setenv(name, value)
        source = Sandbox.create()
        try:
            with pytest.raises(SandboxException, match=r"400: .*and this one \d+\.\d MiB, over the 1 MiB they may"):
                source.create_snapshot("over-the-space", mode="full")  # even an idle sandbox's memory is MiBs
            assert _memory_images(server) == []  # the image went again
            assert Sandbox.list_snapshots().next_items() == []
            assert source.commands.run("echo runs on").stdout == "runs on\n"
        finally:
            source.kill()
