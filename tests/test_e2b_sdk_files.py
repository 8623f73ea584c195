"""The real `e2b` SDK's filesystem API against `agent-sandbox serve`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e2b import FileType, Sandbox
from e2b.exceptions import NotFoundException

from tests.polling import wait_for


def test_text_and_one_mebibyte_binary_round_trip(sbx: Sandbox) -> None:
    info = sbx.files.write("notes/hello.txt", "héllo")
    assert info.path == "/home/user/notes/hello.txt"
    assert sbx.files.read("/home/user/notes/hello.txt") == "héllo"
    blob = os.urandom(1 << 20)
    sbx.files.write("/tmp/blob.bin", blob)
    assert sbx.files.read("/tmp/blob.bin", format="bytes") == blob


def test_list_with_depth_exists_and_get_info(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/tree/a/b/deep.txt", "x")
    shallow = {e.path for e in sbx.files.list("/home/user/tree", depth=1)}
    assert shallow == {"/home/user/tree/a"}
    deep = {e.path for e in sbx.files.list("/home/user/tree", depth=3)}
    assert "/home/user/tree/a/b/deep.txt" in deep
    assert sbx.files.exists("/home/user/tree/a/b/deep.txt")
    assert not sbx.files.exists("/home/user/tree/nope")
    info = sbx.files.get_info("/home/user/tree/a/b/deep.txt")
    assert info.type == FileType.FILE
    assert info.size == 1
    assert info.owner == "user"


def test_make_dir_rename_and_remove(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("/home/user/newdir") is True
    assert sbx.files.make_dir("/home/user/newdir") is False
    sbx.files.write("/home/user/newdir/f.txt", "data")
    moved = sbx.files.rename("/home/user/newdir/f.txt", "/home/user/moved.txt")
    assert moved.path == "/home/user/moved.txt"
    sbx.files.remove("/home/user/moved.txt")
    assert not sbx.files.exists("/home/user/moved.txt")
    with pytest.raises(NotFoundException):
        sbx.files.read("/home/user/moved.txt")


def test_watch_dir_reports_writes(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/watched")
    handle = sbx.files.watch_dir("/home/user/watched")
    sbx.files.write("/home/user/watched/new.txt", "x")
    names: set[str] = set()

    def reported() -> bool:
        names.update(event.name for event in handle.get_new_events())
        return "new.txt" in names

    wait_for(reported, what="the watcher to report new.txt")
    handle.stop()


def test_path_traversal_stays_inside_the_sandbox(sbx: Sandbox) -> None:
    marker = f"inside-{sbx.sandbox_id}"
    sbx.files.write("/home/user/../../tmp/escape.txt", marker)
    assert sbx.files.read("/tmp/escape.txt") == marker
    host_file = Path("/tmp/escape.txt")
    assert not host_file.exists() or host_file.read_text() != marker
