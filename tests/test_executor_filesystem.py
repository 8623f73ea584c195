"""filesystem.Filesystem through the real e2b SDK: stat, list, make_dir, rename, remove, watch."""

from __future__ import annotations

import asyncio

import pytest
from e2b import (
    EntryInfo,
    FileNotFoundException,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
)

from tests.executor_fixtures import Envd, envd_fixture, workdir_fixture  # noqa: F401 - fixtures
from tests.polling import wait_for

pytestmark = pytest.mark.anyio

WATCH_DEADLINE = 10.0


def test_list_returns_direct_children_at_depth_one(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/b.txt", "bb")
    sandbox.files.make_dir(f"{workdir}/a/nested")
    entries = sandbox.files.list(workdir)
    assert [(entry.name, entry.type, entry.path) for entry in entries] == [
        ("a", FileType.DIR, f"{workdir}/a"),
        ("b.txt", FileType.FILE, f"{workdir}/b.txt"),
    ]
    assert entries[1].size == 2


def test_list_with_depth_two_includes_grandchildren(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/a/nested/deep/file.txt", "x")
    assert [entry.path for entry in sandbox.files.list(workdir, depth=2)] == [f"{workdir}/a", f"{workdir}/a/nested"]


def test_list_of_a_missing_directory_is_file_not_found(envd: Envd, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        envd.sandbox().files.list(f"{workdir}/missing")


def test_list_of_a_file_is_an_invalid_argument(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/f", "x")
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        sandbox.files.list(f"{workdir}/f")


def test_exists_tells_present_from_missing(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/here", "x")
    assert (sandbox.files.exists(f"{workdir}/here"), sandbox.files.exists(f"{workdir}/gone")) == (True, False)


def test_get_info_fills_every_field(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/info.txt", "hello")
    sandbox.commands.run(f"chmod 640 {workdir}/info.txt && touch -d '2024-05-06T07:08:09Z' {workdir}/info.txt")
    info = sandbox.files.get_info(f"{workdir}/info.txt")
    assert (info.name, info.type, info.path, info.size) == ("info.txt", FileType.FILE, f"{workdir}/info.txt", 5)
    owner = envd.default_user
    assert (info.mode, info.permissions, info.owner, info.group) == (0o640, "-rw-r-----", owner, owner)
    assert info.modified_time.isoformat() == "2024-05-06T07:08:09+00:00"
    assert info.symlink_target is None


def test_get_info_of_a_symlink_reports_target_and_link(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.make_dir(f"{workdir}/target")
    sandbox.commands.run(f"ln -s {workdir}/target {workdir}/link")
    info = sandbox.files.get_info(f"{workdir}/link")
    assert (info.type, info.symlink_target, info.permissions[0]) == (FileType.SYMLINK, f"{workdir}/target", "l")


def test_make_dir_creates_parents_and_reports_an_existing_directory(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    assert sandbox.files.make_dir(f"{workdir}/x/y/z") is True
    assert sandbox.files.make_dir(f"{workdir}/x/y/z") is False
    assert sandbox.files.get_info(f"{workdir}/x/y").type == FileType.DIR


def test_make_dir_over_a_file_is_an_invalid_argument(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/plain", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.make_dir(f"{workdir}/plain")


def test_rename_moves_into_new_directories(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/from.txt", "moved")
    info = sandbox.files.rename(f"{workdir}/from.txt", f"{workdir}/new/dir/to.txt")
    assert (info.name, info.path) == ("to.txt", f"{workdir}/new/dir/to.txt")
    assert sandbox.files.read(f"{workdir}/new/dir/to.txt") == "moved"
    assert not sandbox.files.exists(f"{workdir}/from.txt")


def test_rename_of_a_missing_file_is_file_not_found(envd: Envd, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        envd.sandbox().files.rename(f"{workdir}/nothing", f"{workdir}/else")


def test_remove_deletes_files_and_whole_trees(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/tree/a/b.txt", "x")
    sandbox.files.write(f"{workdir}/single.txt", "x")
    sandbox.files.remove(f"{workdir}/tree")
    sandbox.files.remove(f"{workdir}/single.txt")
    assert sandbox.files.list(workdir) == []


def test_remove_of_a_missing_path_succeeds_as_in_envd(envd: Envd, workdir: str) -> None:
    """envd removes with Go's os.RemoveAll, for which nothing to remove is no error."""
    envd.sandbox().files.remove(f"{workdir}/absent")
    envd.sandbox().files.remove(f"{workdir}/absent/below")


def test_remove_of_a_symlink_removes_the_link_not_its_target(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/target/kept.txt", "x")
    sandbox.commands.run(f"ln -s {workdir}/target {workdir}/link")
    sandbox.files.remove(f"{workdir}/link")
    assert [entry.name for entry in sandbox.files.list(workdir)] == ["target"]
    assert sandbox.files.exists(f"{workdir}/target/kept.txt")


def test_dot_dot_is_an_ordinary_path_inside_the_sandbox(envd: Envd, workdir: str) -> None:
    """`..` is not filtered: paths mean what they mean to the sandbox's kernel.

    The sandbox boundary (its own mount namespace) is the protection, not path checks.
    """
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/sub/../up.txt", "x")
    assert sandbox.files.exists(f"{workdir}/up.txt")
    depth = workdir.count("/")
    relative_from_home = "../" * 2 + f"{'/'.join(workdir.split('/')[1:])}/rel.txt"
    sandbox.files.write(relative_from_home, "from home")  # the user is root: home is /root
    assert sandbox.files.read(f"{workdir}/rel.txt") == "from home"
    assert "root:" in sandbox.files.read("/" + "../" * depth + "etc/passwd")


def test_polling_watcher_reports_events_with_relative_names(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.files.watch_dir(workdir)
    try:
        sandbox.files.write(f"{workdir}/watched.txt", "x")
        seen: set[tuple[str, FilesystemEventType]] = set()
        for _ in range(50):  # events are queued before the write returns; a few polls at most
            seen |= {(event.name, event.type) for event in handle.get_new_events()}
            if ("watched.txt", FilesystemEventType.WRITE) in seen:
                break
        assert {("watched.txt", FilesystemEventType.CREATE), ("watched.txt", FilesystemEventType.WRITE)} <= seen
    finally:
        handle.stop()


def test_recursive_watcher_sees_new_subdirectories(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.files.watch_dir(workdir, recursive=True)
    try:
        sandbox.files.make_dir(f"{workdir}/child")
        sandbox.files.write(f"{workdir}/child/inner.txt", "x")
        names: set[str] = set()

        def both() -> bool:  # a new directory's events wait for the user's look at it (a helper call, or its start)
            names.update(event.name for event in handle.get_new_events())
            return {"child", "child/inner.txt"} <= names

        wait_for(both, what="the events of the new directory and of the file made in it")
    finally:
        handle.stop()


def test_watch_with_include_entry_carries_each_entrys_info_and_metadata(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.files.watch_dir(workdir, include_entry=True, allow_network_mounts=True)
    try:
        sandbox.files.write(f"{workdir}/seen.txt", "x", metadata={"k": "v"})
        entries: list[EntryInfo] = []

        def tagged() -> bool:  # the metadata is set last: its CHMOD event (IN_ATTRIB) is read after it
            entries.extend(event.entry for event in handle.get_new_events() if event.entry is not None)
            return any(entry.metadata == {"k": "v"} for entry in entries)

        wait_for(tagged, what="an event whose entry carries the metadata")
        assert {(entry.name, entry.path, entry.type) for entry in entries} == {
            ("seen.txt", f"{workdir}/seen.txt", FileType.FILE)
        }
        assert {"k": "v"} in [entry.metadata for entry in entries]
    finally:
        handle.stop()


def test_watch_without_include_entry_sends_no_entry(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    handle = sandbox.files.watch_dir(workdir)
    try:
        sandbox.files.write(f"{workdir}/bare.txt", "x")
        events: list[FilesystemEvent] = []

        def written() -> bool:
            events.extend(handle.get_new_events())
            return any(event.type == FilesystemEventType.WRITE for event in events)

        wait_for(written, what="the write event")
        assert [event.entry for event in events] == [None] * len(events)
    finally:
        handle.stop()


def test_watch_of_a_missing_directory_is_file_not_found(envd: Envd, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        envd.sandbox().files.watch_dir(f"{workdir}/missing")


async def test_streaming_watch_delivers_events_as_they_happen(envd: Envd, workdir: str) -> None:
    async def scenario() -> set[tuple[str, FilesystemEventType]]:
        sandbox = envd.async_sandbox()
        seen: set[tuple[str, FilesystemEventType]] = set()
        removed = asyncio.Event()

        def on_event(event: object) -> None:
            seen.add((event.name, event.type))  # type: ignore[attr-defined]
            if event.type == FilesystemEventType.REMOVE:  # type: ignore[attr-defined]
                removed.set()

        handle = await sandbox.files.watch_dir(workdir, on_event=on_event)
        try:
            await sandbox.files.write(f"{workdir}/streamed.txt", "x")
            await sandbox.files.remove(f"{workdir}/streamed.txt")
            await asyncio.wait_for(removed.wait(), WATCH_DEADLINE)
        finally:
            await handle.stop()  # type: ignore[no-untyped-call]
        return seen

    seen = await scenario()
    assert {("streamed.txt", FilesystemEventType.CREATE), ("streamed.txt", FilesystemEventType.REMOVE)} <= seen
