"""A watch through envd covers what the user's own inotify watch would, and no more (`executor/_watch_service.py`).

In a real sandbox: a recursive watch as `user` leaves out the subdirectories it may not list (a root-only 0700
directory, there from the start or made later) and reports nothing from inside them, while it still sees its
own; an event's entry is read with its rights too. Root's watch of the same tree sees everything, as before.
Each test ends on an event written after the ones that must not come, so those would have arrived by then.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from e2b import FilesystemEvent, Sandbox, WatchHandle

from tests.executor_fixtures import Envd, envd_fixture  # noqa: F401 - fixtures
from tests.polling import wait_for


def as_root(sandbox: Sandbox, command: str) -> None:
    result = sandbox.commands.run(command, user="root")
    assert result.exit_code == 0, result.stderr


@pytest.fixture
def tree(envd: Envd) -> Iterator[str]:
    """A directory of `user`'s with `open/` (user's) and `secret/inner/` (root's, `secret` mode 0700) in it."""
    sandbox = envd.sandbox()
    top = f"/tmp/watch-rights-{uuid.uuid4().hex}"
    as_root(sandbox, f"mkdir -p {top}/open {top}/secret/inner && chown -R user: {top}/open && chown user: {top}")
    as_root(sandbox, f"chmod 700 {top}/secret")
    yield top
    as_root(sandbox, f"rm -rf {top}")


@contextmanager
def watching(sandbox: Sandbox, tree: str, user: str, **options: bool) -> Iterator[WatchHandle]:
    """A recursive watch of `tree` as `user`, stopped when the block ends."""
    handle = sandbox.files.watch_dir(tree, recursive=True, user=user, **options)
    try:
        yield handle
    finally:
        handle.stop()


def events_until(handle: WatchHandle, name: str) -> list[FilesystemEvent]:
    """The events `handle` reports up to the first one named `name`."""
    seen: list[FilesystemEvent] = []

    def arrived() -> bool:
        seen.extend(handle.get_new_events())
        return any(event.name == name for event in seen)

    wait_for(arrived, what=f"the event of {name}")
    return seen


def test_a_users_recursive_watch_leaves_out_what_it_may_not_list(envd: Envd, tree: str) -> None:
    sandbox = envd.sandbox()
    with watching(sandbox, tree, "user") as handle:
        as_root(sandbox, f"echo x > {tree}/secret/hidden.txt && echo x > {tree}/secret/inner/deeper.txt")
        sandbox.files.write(f"{tree}/open/seen.txt", "x", user="user")
        names = {event.name for event in events_until(handle, "open/seen.txt")}
        assert not {name for name in names if name.startswith("secret/")}


def test_a_subdirectory_made_later_is_watched_only_if_the_user_may_list_it(envd: Envd, tree: str) -> None:
    sandbox = envd.sandbox()
    with watching(sandbox, tree, "user") as handle:
        as_root(sandbox, f"mkdir -m 700 {tree}/late && mkdir -m 755 {tree}/public")
        as_root(sandbox, f"echo x > {tree}/public/probe.txt")
        events_until(handle, "public/probe.txt")  # `public` is watched, so the look at both is over
        as_root(sandbox, f"echo x > {tree}/late/hidden.txt && echo x > {tree}/public/seen.txt")
        sandbox.files.write(f"{tree}/open/mine.txt", "x", user="user")
        names = {event.name for event in events_until(handle, "open/mine.txt")}
        assert "public/seen.txt" in names
        assert not {name for name in names if name.startswith("late/")}


def test_roots_recursive_watch_still_sees_everything(envd: Envd, tree: str) -> None:
    sandbox = envd.sandbox()
    with watching(sandbox, tree, "root") as handle:
        as_root(sandbox, f"mkdir -m 700 {tree}/late")
        as_root(sandbox, f"echo x > {tree}/secret/inner/deeper.txt")
        events_until(handle, "secret/inner/deeper.txt")
        as_root(sandbox, f"echo x > {tree}/late/seen.txt")
        events_until(handle, "late/seen.txt")


@pytest.mark.parametrize(("user", "metadata"), [("user", {}), ("root", {"k": "v"})])
def test_an_events_entry_is_what_the_user_may_see(envd: Envd, tree: str, user: str, metadata: dict[str, str]) -> None:
    """A root file of mode 0600 in the user's directory: `user` may stat it but not read its metadata (xattrs)."""
    sandbox = envd.sandbox()
    handle = sandbox.files.watch_dir(tree, include_entry=True, user=user)
    try:
        sandbox.files.write(f"{tree}/private.txt", "x", metadata={"k": "v"}, user="root")
        as_root(sandbox, f"chmod 600 {tree}/private.txt && touch {tree}/last.txt")
        entries = [event.entry for event in events_until(handle, "last.txt") if event.name == "private.txt"]
        closed = [entry for entry in entries if entry is not None and entry.permissions == "-rw-------"]
        assert closed  # the chmod's event, whose entry was read after it
        assert [entry.metadata or {} for entry in closed] == [metadata] * len(closed)  # the SDK says None for {}
        assert {(entry.owner, entry.size) for entry in closed} == {("root", 1)}
    finally:
        handle.stop()
