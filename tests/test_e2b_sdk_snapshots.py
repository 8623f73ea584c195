"""E2B's snapshots with the real `e2b` SDK: `create_snapshot(mode="filesystem")` makes a template of a running
sandbox's files (it runs on, its processes untouched), `Sandbox.create(<snapshot id>)` starts afresh over them,
`list_snapshots` and `delete_snapshot` see only the key's own. Snapshots with memory (`mode="full"`, and no mode,
E2B's default): `test_e2b_sdk_memory_snapshots`."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import Sandbox, SandboxException

from tests.runtime_fixtures import IMAGE_CACHE
from tests.server_fixtures import RunningServer, point_e2b_at, running_server
from tests.ui_fixtures import new_key, sdk_options

NOTE = "/home/user/note.txt"


def _snapshot_layers() -> set[str]:
    """The snapshot layers in the image cache the test servers share."""
    return {path.name for path in (IMAGE_CACHE / "layers").glob("snapshot-*")}


def test_a_filesystem_snapshot_is_a_template_of_the_files_and_the_source_runs_on(sbx: Sandbox) -> None:
    sbx.files.write(NOTE, "before the snapshot")
    sbx.commands.run("rm /etc/debian_version", user="root")  # a file of the template's layers, gone in the copy too
    sleeper = sbx.commands.run("sleep 600", background=True)

    snapshot = sbx.create_snapshot("probe-snap", mode="filesystem")

    assert (snapshot.snapshot_id, snapshot.names) == ("probe-snap:default", ["probe-snap:default"])
    assert sleeper.pid in [process.pid for process in sbx.commands.list()]  # the source kept its processes
    sbx.files.write(NOTE, "after the snapshot")  # and runs on: this is not in the snapshot
    copy = Sandbox.create(snapshot.snapshot_id)
    try:
        assert copy.files.read(NOTE) == "before the snapshot"
        assert copy.commands.run(f"stat -c %U {NOTE}").stdout == "user\n"
        assert not copy.files.exists("/etc/debian_version")
        assert "sleep 600" not in copy.commands.run("ps -eo args").stdout  # started afresh over the files
    finally:
        copy.kill()


def test_snapshots_are_listed_per_sandbox_and_deleted_like_templates(sbx: Sandbox, e2b_env: RunningServer) -> None:
    named = sbx.create_snapshot("listed-snap", mode="filesystem")
    unnamed = sbx.create_snapshot(mode="filesystem")  # named by its template ID
    other = Sandbox.create()
    try:
        listed = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()]
        assert listed == [named.snapshot_id, unnamed.snapshot_id]
        assert Sandbox.list_snapshots(sandbox_id=other.sandbox_id).next_items() == []
        everything = {s.snapshot_id for s in Sandbox.list_snapshots().next_items()}
        assert {named.snapshot_id, unnamed.snapshot_id} <= everything
        stranger = sdk_options(e2b_env, new_key(e2b_env, "snapshot-stranger"))
        assert Sandbox.list_snapshots(**stranger).next_items() == []
        with pytest.raises(SandboxException, match="404: template 'listed-snap:default' not found"):
            Sandbox.create(named.snapshot_id, **stranger)
        assert Sandbox.create(unnamed.snapshot_id).kill()
    finally:
        other.kill()
    assert Sandbox.delete_snapshot(named.snapshot_id)
    assert Sandbox.delete_snapshot(unnamed.snapshot_id)
    assert not Sandbox.delete_snapshot(named.snapshot_id)  # gone already
    with pytest.raises(SandboxException, match="404: template 'listed-snap:default' not found"):
        Sandbox.create(named.snapshot_id)
    assert Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items() == []


def test_a_paused_sandbox_must_be_connected_before_its_snapshot(sbx: Sandbox) -> None:
    assert sbx.pause()
    with pytest.raises(SandboxException, match="connect to it"):
        Sandbox.create_snapshot(sbx.sandbox_id, "paused-snap", mode="filesystem")
    Sandbox.connect(sbx.sandbox_id)
    again = Sandbox.create_snapshot(sbx.sandbox_id, "paused-snap", mode="filesystem")
    assert again.snapshot_id == "paused-snap:default"
    assert Sandbox.delete_snapshot("paused-snap:default")


def test_a_deleted_snapshots_files_go_once_no_sandbox_started_from_it_lives(sbx: Sandbox) -> None:
    before = _snapshot_layers()
    snapshot = sbx.create_snapshot("freed-snap", mode="filesystem")
    [layer] = _snapshot_layers() - before
    child = Sandbox.create(snapshot.snapshot_id)
    assert Sandbox.delete_snapshot(snapshot.snapshot_id)
    assert layer in _snapshot_layers()  # the child's files sit over it
    assert child.commands.run("echo alive").stdout == "alive\n"
    child.kill()
    again = sbx.create_snapshot("freed-snap", mode="filesystem")
    [second] = _snapshot_layers() - before - {layer}
    assert Sandbox.delete_snapshot(again.snapshot_id)
    assert second not in _snapshot_layers()


def test_a_tag_snapshotted_again_names_the_new_files_and_the_old_ones_go(sbx: Sandbox) -> None:
    before = _snapshot_layers()
    sbx.files.write(NOTE, "first")
    first = sbx.create_snapshot("re-snap:v2", mode="filesystem")
    [old] = _snapshot_layers() - before
    sbx.files.write(NOTE, "second")
    second = sbx.create_snapshot("re-snap:v2", mode="filesystem")
    assert first.snapshot_id == second.snapshot_id == "re-snap:v2"
    assert old not in _snapshot_layers()  # nothing stood on the first any more
    [listed] = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
    assert (listed.snapshot_id, listed.names) == ("re-snap:v2", ["re-snap:v2"])
    copy = Sandbox.create("re-snap:v2")
    try:
        assert copy.files.read(NOTE) == "second"
    finally:
        copy.kill()
        assert Sandbox.delete_snapshot("re-snap:v2")


def test_paging_survives_the_deletion_of_the_snapshot_a_page_ended_with(sbx: Sandbox) -> None:
    made = [sbx.create_snapshot(f"paged-{i}", mode="filesystem").snapshot_id for i in range(3)]
    pages = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=1)
    seen = [s.snapshot_id for s in pages.next_items()]
    assert Sandbox.delete_snapshot(seen[0])  # a clean-up loop deletes as it goes
    while pages.has_next:
        for snapshot in pages.next_items():
            seen.append(snapshot.snapshot_id)
            assert Sandbox.delete_snapshot(snapshot.snapshot_id)
    assert seen == made


def test_a_deleted_snapshot_stays_for_its_sandboxes_over_restarts_then_goes(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_server(data_dir) as first:
        point_e2b_at(first, monkeypatch)
        source = Sandbox.create()
        source.files.write(NOTE, "in the snapshot")
        before = _snapshot_layers()
        snapshot = source.create_snapshot("tombstoned", mode="filesystem")
        [layer] = _snapshot_layers() - before
        child = Sandbox.create(snapshot.snapshot_id, timeout=600)
        source.kill()
        assert Sandbox.delete_snapshot(snapshot.snapshot_id)
        first.stop()  # the child outlives the server
        with running_server(data_dir) as second:
            point_e2b_at(second, monkeypatch)
            kept = Sandbox.connect(child.sandbox_id)
            assert kept.pause()
            kept = Sandbox.connect(child.sandbox_id)  # resumed from a template deleted before the restart
            assert kept.files.read(NOTE) == "in the snapshot"
            assert Sandbox.list_snapshots().next_items() == []
            with pytest.raises(SandboxException, match="404: template 'tombstoned:default' not found"):
                Sandbox.create(snapshot.snapshot_id)
            assert layer in _snapshot_layers()
            kept.kill()
            second.stop()
            with running_server(data_dir) as third:
                point_e2b_at(third, monkeypatch)
                assert layer not in _snapshot_layers()  # no sandbox stands on it: it went at the start
                assert Sandbox.list_snapshots().next_items() == []


def test_a_snapshot_past_the_keys_disk_space_is_refused_and_nothing_of_it_is_kept(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_server(data_dir, "--key-max-snapshot-mb", "2") as server:
        point_e2b_at(server, monkeypatch)
        source = Sandbox.create()
        try:
            small = source.create_snapshot("fits", mode="filesystem")  # a fresh sandbox's files: a few KiB
            source.commands.run("head -c 3M /dev/urandom > /home/user/big.bin")
            before = _snapshot_layers()
            with pytest.raises(SandboxException, match=r"400: .*snapshots take 0\.\d MiB of disk and this one 3\.\d "
                               r"MiB, over the 2 MiB they may: delete some first"):  # fmt: skip
                source.create_snapshot("too-big", mode="filesystem")
            assert _snapshot_layers() == before  # its copy of the files went again
            assert [s.snapshot_id for s in Sandbox.list_snapshots().next_items()] == [small.snapshot_id]
            source.commands.run("rm /home/user/big.bin")
            assert source.create_snapshot("fits-again", mode="filesystem").snapshot_id == "fits-again:default"
        finally:
            source.kill()
