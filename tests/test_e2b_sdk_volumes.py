"""E2B's volumes with the real SDK: the Volume API, its content API, and `volume_mounts` at create.

A volume is the key's, outlives the sandboxes that mount it, is mounted with the sandbox's own ids (what
uid 1000 owns in the volume, `user` owns in every sandbox), and its content API (the volume's bearer
token, no API key) resolves every path inside the volume, whatever symlinks a sandbox planted.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import (
    AsyncVolume,
    NotFoundException,
    Sandbox,
    SandboxException,
    Volume,
    VolumeException,
    VolumeFileType,
)

from tests.server_fixtures import RunningServer, point_e2b_at, running_server


@pytest.fixture
def volume(e2b_env: RunningServer) -> Iterator[Volume]:
    made = Volume.create(f"vol-{uuid.uuid4().hex[:8]}")
    try:
        yield made
    finally:
        Volume.destroy(made.volume_id)


def test_a_volume_written_by_one_sandbox_is_read_by_another_after_the_first_is_killed(volume: Volume) -> None:
    first = Sandbox.create(volume_mounts={"/mnt/data": volume})
    assert first.get_info().volume_mounts == [{"name": volume.name, "path": "/mnt/data"}]
    first.commands.run("mkdir -p /mnt/data/run && echo 'kept across sandboxes' > /mnt/data/run/out.txt")
    first.kill()
    second = Sandbox.create(volume_mounts={"/work/shared": volume.name})  # by name too
    try:
        assert second.commands.run("cat /work/shared/run/out.txt").stdout == "kept across sandboxes\n"
        owners = second.commands.run("stat -c '%U:%G' /work/shared /work/shared/run/out.txt").stdout.split()
        assert owners == ["user:user", "user:user"]  # the sandbox's `user` owns what it wrote, in any sandbox
    finally:
        second.kill()
    assert volume.read_file("/run/out.txt") == "kept across sandboxes\n"


def test_the_content_api_writes_lists_stats_updates_and_removes(volume: Volume) -> None:
    volume.make_dir("/notes")
    written = volume.write_file("/notes/today.txt", "from the api")
    assert (written.path, written.size, written.uid, written.gid, written.mode) == (
        "/notes/today.txt",
        12,
        1000,
        1000,
        0o644,
    )
    volume.write_file("/notes/root-only.txt", b"\x00\x01", uid=0, gid=0, mode=0o600)
    made = volume.make_dir("/deep/er/est", force=True, mode=0o750)
    assert (made.type, made.mode) == (VolumeFileType.DIRECTORY, 0o750)
    listed = volume.list("/", depth=3)
    assert [entry.path for entry in listed] == [
        "/deep", "/deep/er", "/deep/er/est", "/notes", "/notes/root-only.txt", "/notes/today.txt",
    ]  # fmt: skip
    assert [entry.name for entry in volume.list("/notes")] == ["root-only.txt", "today.txt"]
    assert volume.read_file("/notes/root-only.txt", format="bytes") == b"\x00\x01"
    updated = volume.update_metadata("/notes/root-only.txt", uid=1000, mode=0o640)
    assert (updated.uid, updated.gid, updated.mode) == (1000, 0, 0o640)
    assert volume.exists("/notes/today.txt")
    volume.remove("/deep")
    assert not volume.exists("/deep/er")
    with pytest.raises(NotFoundException):
        volume.read_file("/missing.txt")
    with pytest.raises(NotFoundException):
        volume.write_file("/no/parent.txt", "x")  # without force, the parent must exist
    with pytest.raises(VolumeException, match="already exists"):
        volume.make_dir("/notes")


def test_a_sandboxs_symlinks_never_lead_the_content_api_out_of_the_volume(volume: Volume) -> None:
    sandbox = Sandbox.create(volume_mounts={"/v": volume})
    try:
        sandbox.commands.run("ln -s /etc/passwd /v/passwd && ln -s / /v/root && ln -s ../../.. /v/up", user="root")
    finally:
        sandbox.kill()
    link = volume.get_info("/passwd")
    assert (link.type, link.target) == (VolumeFileType.SYMLINK, "/etc/passwd")
    with pytest.raises(NotFoundException):
        volume.read_file("/passwd")  # /etc/passwd of the volume, which has none: not the host's
    assert [entry.name for entry in volume.list("/root")] == ["passwd", "root", "up"]  # `/` is the volume's root
    volume.write_file("/up/escaped.txt", "stays inside")  # a link's `..` stops at the volume's root
    assert volume.read_file("/escaped.txt") == "stays inside"
    for path in ("/..", "/../..", "/root/.."):  # as a last component it would be the volume's host directory
        with pytest.raises(VolumeException, match=r"'\.\.' is not allowed"):
            volume.remove(path)
        with pytest.raises(VolumeException, match=r"'\.\.' is not allowed"):
            volume.update_metadata(path, uid=1000, mode=0o777)
    assert volume.read_file("/escaped.txt") == "stays inside"  # the volume is whole


def test_the_content_api_needs_the_volumes_own_token(e2b_env: RunningServer, volume: Volume) -> None:
    other = Volume.create(f"other-{uuid.uuid4().hex[:8]}")
    try:
        url = f"{e2b_env.url}/volumecontent/{volume.volume_id}/dir"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {other.token}"}):
            answer = httpx.get(url, params={"path": "/"}, headers=headers, timeout=30)
            assert answer.status_code == 401
            assert answer.json()["code"] == 401
        keyed = httpx.get(url, params={"path": "/"}, headers={"X-API-Key": e2b_env.api_key}, timeout=30)
        assert keyed.status_code == 401  # the API key is not the volume's token
    finally:
        Volume.destroy(other.volume_id)


def test_volumes_are_listed_connected_and_destroyed_per_key(volume: Volume) -> None:
    assert volume.name in [info.name for info in Volume.list()]
    connected = Volume.connect(volume.volume_id)
    assert (connected.name, connected.token) == (volume.name, volume.token)
    with pytest.raises(VolumeException, match="already exists"):
        Volume.create(volume.name)
    sandbox = Sandbox.create(volume_mounts={"/data": volume})
    try:
        with pytest.raises(VolumeException, match=f"mounted by sandbox {sandbox.sandbox_id}"):
            Volume.destroy(volume.volume_id)
    finally:
        sandbox.kill()
    assert Volume.destroy("nosuchvolume") is False


@pytest.mark.parametrize(
    ("mounts", "message"),
    [
        ({"/data": "no-such-volume"}, "no volume named no-such-volume"),
        ({"data/relative": "VOLUME"}, "the path must be absolute and clean"),
        ({"/data/../etc": "VOLUME"}, "the path must be absolute and clean"),
        ({"/proc/x": "VOLUME"}, "are the sandbox's own"),
        ({"/usr": "VOLUME"}, "(and what holds them) are the sandbox's own"),
    ],
)
def test_a_bad_volume_mount_is_a_400_that_names_it(volume: Volume, mounts: dict[str, str], message: str) -> None:
    with pytest.raises(SandboxException, match="400") as raised:
        Sandbox.create(volume_mounts={path: volume.name if name == "VOLUME" else name for path, name in mounts.items()})
    assert message in str(raised.value)


def test_a_sandbox_with_a_volume_pauses_frozen_and_resumes_with_its_processes(
    e2b_env: RunningServer, volume: Volume
) -> None:
    sandbox = Sandbox.create(volume_mounts={"/data": volume})
    try:
        sandbox.commands.run("sleep 600", background=True)
        assert sandbox.pause()
        assert not (e2b_env.data_dir / "sandboxes" / sandbox.sandbox_id / "checkpoint").exists()  # no CRIU image
        sandbox.connect()
        assert sandbox.commands.run("pgrep -x sleep").exit_code == 0
        sandbox.commands.run("echo after > /data/after.txt")
    finally:
        sandbox.kill()
    assert volume.read_file("/after.txt") == "after\n"


def test_a_filesystem_pause_keeps_the_sandboxs_files_and_mounts_the_volume_again(volume: Volume) -> None:
    sandbox = Sandbox.create(volume_mounts={"/data": volume})
    try:
        sandbox.commands.run("echo own > /home/user/own.txt && echo shared > /data/shared.txt")
        assert sandbox.pause(mode="filesystem")
        sandbox.connect()
        assert sandbox.commands.run("cat /home/user/own.txt /data/shared.txt").stdout == "own\nshared\n"
        assert sandbox.get_info().volume_mounts == [{"name": volume.name, "path": "/data"}]
    finally:
        sandbox.kill()


@pytest.mark.anyio
async def test_the_async_sdk_creates_writes_and_reads_a_volume(e2b_env: RunningServer) -> None:
    made = await AsyncVolume.create(f"async-{uuid.uuid4().hex[:8]}")
    try:
        await made.write_file("/a.txt", "async")
        assert await made.read_file("/a.txt") == "async"
        assert [entry.name for entry in await made.list("/")] == ["a.txt"]
    finally:
        await AsyncVolume.destroy(made.volume_id)


def test_volumes_and_their_sandboxes_outlive_a_server_restart(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_server(data_dir) as first:
        point_e2b_at(first, monkeypatch)
        volume = Volume.create("kept")
        volume.write_file("/before.txt", "before the restart")
        sandbox = Sandbox.create(volume_mounts={"/data": volume}, timeout=600)
        sandbox.commands.run("sleep 600", background=True)
        first.stop()  # a sandbox outlives the server (the block's end cleans up)
        with running_server(data_dir) as second:
            point_e2b_at(second, monkeypatch)
            again = Volume.connect(volume.volume_id)
            assert again.read_file("/before.txt") == "before the restart"
            kept = Sandbox.connect(sandbox.sandbox_id)
            ran = kept.commands.run("cat /data/before.txt && pgrep -x sleep >/dev/null && echo ' alive'")
            assert ran.stdout == "before the restart alive\n"
            kept.kill()
            Volume.destroy(volume.volume_id)
