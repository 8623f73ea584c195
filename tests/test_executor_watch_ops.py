"""What a watch covers, in this process: the directories `_fs_ops` finds (links not followed) and the `Watcher`,
which watches each only while its path still names the directory that was found."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from executor import _fs_ops
from executor._errors import ExecutorError, InvalidArgument
from executor._inotify import FsEvent, Watcher


def test_listable_directories_are_every_directory_under_the_paths_but_not_through_links(tmp_path: Path) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "z").mkdir()
    (tmp_path / "a" / "file").write_text("")
    (tmp_path / "outside" / "inner").mkdir(parents=True)
    (tmp_path / "a" / "link").symlink_to(tmp_path / "outside")
    found = _fs_ops.listable_directories([str(tmp_path / "a"), str(tmp_path / "missing"), str(tmp_path / "a/link")])
    assert [directory.path for directory in found] == [str(tmp_path / name) for name in ("a", "a/b", "a/b/c", "a/z")]
    info = os.stat(tmp_path / "a" / "b")
    assert (found[1].device, found[1].inode) == (info.st_dev, info.st_ino)


def test_check_directory_finds_the_tree_only_when_recursive(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert [d.path for d in _fs_ops.check_directory(str(tmp_path), False)] == [str(tmp_path)]
    assert [d.path for d in _fs_ops.check_directory(str(tmp_path), True)] == [str(tmp_path), str(tmp_path / "sub")]
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidArgument, match="is not a directory"):
        _fs_ops.check_directory(str(tmp_path / "file"), True)


def test_a_directory_replaced_after_the_check_is_not_watched(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    top, sub = _fs_ops.check_directory(str(tmp_path), True)
    (tmp_path / "sub").rename(tmp_path / "checked")
    (tmp_path / "sub").mkdir()  # another directory by the checked one's name

    async def scenario() -> list[FsEvent]:
        events: list[FsEvent] = []
        arrived = asyncio.Event()

        def on_events(batch: list[FsEvent]) -> None:
            events.extend(batch)
            if any(name == "last" for name, _, _ in batch):
                arrived.set()

        watcher = Watcher(top, [sub], on_events, _broken)
        try:
            (tmp_path / "sub" / "inside").write_text("x")
            (tmp_path / "checked" / "inside").write_text("x")
            (tmp_path / "last").write_text("x")
            await asyncio.wait_for(arrived.wait(), 10)
        finally:
            watcher.close()
        return events

    assert {name for name, _, _ in asyncio.run(scenario())} == {"last"}


@pytest.mark.parametrize("allowed", [True, False])
def test_a_new_subdirectorys_events_wait_for_the_users_look_and_go_if_it_may_not_list_it(
    tmp_path: Path, allowed: bool
) -> None:
    (top,) = _fs_ops.check_directory(str(tmp_path), True)

    async def scenario() -> list[str]:
        names: list[str] = []
        changed = asyncio.Event()
        answer = asyncio.Event()

        def on_events(batch: list[FsEvent]) -> None:
            names.extend(name for name, _, _ in batch)
            changed.set()

        async def expand(paths: list[str]) -> list[_fs_ops.Directory]:
            assert paths == [str(tmp_path / "new")]
            await answer.wait()
            return _fs_ops.listable_directories(paths) if allowed else []

        async def until(name: str) -> None:
            while name not in names:
                changed.clear()
                await asyncio.wait_for(changed.wait(), 10)

        watcher = Watcher(top, [], on_events, _broken, expand)
        try:
            (tmp_path / "new").mkdir()
            await until("new")  # reported at once, and `new` is watched from here on
            (tmp_path / "new" / "inside").write_text("x")
            (tmp_path / "last").write_text("x")
            await until("last")
            assert "new/inside" not in names  # held back: the user's look has not answered
            answer.set()
            if allowed:
                await until("new/inside")
            (tmp_path / "final").write_text("x")
            await until("final")
        finally:
            watcher.close()
        return names

    assert ("new/inside" in asyncio.run(scenario())) is allowed


def _broken(message: str, kind: type[ExecutorError]) -> None:
    """A watcher's `on_error`: here the watch must never break."""
    pytest.fail(f"{kind.__name__}: {message}")
