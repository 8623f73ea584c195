"""The volume content API's file operations (`pool/_local/_volume_files.py`) on a directory, as host root does them.

What a sandbox plants in a volume must never lead these operations out of it: every path is resolved inside
the volume's root, and the last component is never followed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pool import VolumeError
from pool._local import _volume_files as files


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    root = tmp_path / "volume"
    root.mkdir()
    (tmp_path / "outside.txt").write_text("the host's")
    return root


def test_symlinks_resolve_inside_the_volume_and_are_not_followed_when_acted_on(volume: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    (volume / "abs").symlink_to(outside)  # what a sandbox could plant (its /x is the volume's /x)
    (volume / "up").symlink_to("../..")
    (volume / "dir").symlink_to(tmp_path)
    with pytest.raises(VolumeError) as raised:
        files.open_for_read(volume, "/abs")
    assert raised.value.status == 404  # `outside.txt` of the volume, which has none
    with pytest.raises(VolumeError):
        files.open_for_read(volume, "/dir/outside.txt")
    upload = files.Upload(volume, "/up/written.txt", uid=None, gid=None, mode=None)
    upload.write(b"inside")
    upload.finish()
    assert (volume / "written.txt").read_bytes() == b"inside"  # `..` stopped at the root
    files.remove(volume, "/dir")  # the link goes, not what it names
    assert tmp_path.is_dir()
    assert not (volume / "dir").is_symlink()
    files.update(volume, "/abs", uid=1234, gid=None, mode=0o600)  # the link's own owner; its target untouched
    assert os.lstat(volume / "abs").st_uid == 1234
    assert outside.stat().st_uid == 0
    assert outside.read_text() == "the host's"


def test_an_upload_replaces_the_file_only_when_finished(volume: Path) -> None:
    (volume / "data.txt").write_text("old")
    upload = files.Upload(volume, "/data.txt", uid=1000, gid=1000, mode=0o640)
    upload.write(b"new")
    assert (volume / "data.txt").read_text() == "old"
    upload.abandon()
    assert (volume / "data.txt").read_text() == "old"
    assert sorted(os.listdir(volume)) == ["data.txt"]  # no temporary file left
    upload = files.Upload(volume, "/data.txt", uid=1000, gid=1000, mode=0o640)
    upload.write(b"new")
    entry = upload.finish()
    assert (entry["size"], entry["uid"], entry["mode"]) == (3, 1000, 0o640)
    assert (volume / "data.txt").read_text() == "new"


def test_directories_are_made_listed_to_a_depth_and_removed(volume: Path) -> None:
    files.make_dir(volume, "/a/b/c", uid=None, gid=None, mode=None, force=True)
    (volume / "a" / "b" / "c" / "f").write_text("x")
    assert [entry["path"] for entry in files.list_dir(volume, "/", 2)] == ["/a", "/a/b"]
    assert [entry["path"] for entry in files.list_dir(volume, "/a", 3)] == ["/a/b", "/a/b/c", "/a/b/c/f"]
    assert os.stat(volume / "a").st_uid == files.DEFAULT_UID
    with pytest.raises(VolumeError) as raised:
        files.make_dir(volume, "/a", uid=None, gid=None, mode=None, force=False)
    assert raised.value.status == 409
    os.chown(volume / "a", 0, 0)
    files.make_dir(volume, "/a", uid=None, gid=None, mode=0o700, force=True)  # force: an existing one is fine,
    assert (os.stat(volume / "a").st_uid, os.stat(volume / "a").st_mode & 0o777) == (0, 0o755)  # and kept as it was
    files.remove(volume, "/a")
    assert os.listdir(volume) == []
    with pytest.raises(VolumeError) as raised:
        files.remove(volume, "/")
    assert raised.value.status == 400


def test_a_parent_component_is_refused_before_anything_is_touched(volume: Path) -> None:
    (volume / "root").symlink_to("/")
    for path in ("/..", "/a/../..", "/root/.."):
        with pytest.raises(VolumeError) as raised:
            files.remove(volume, path)
        assert raised.value.status == 400
        with pytest.raises(VolumeError):
            files.update(volume, path, uid=1000, gid=1000, mode=0o777)
    assert volume.parent.stat().st_mode & 0o777 != 0o777
    assert volume.is_dir()
