"""envd 0.6.x as an E2B user's code meets it: the real `e2b` SDK against `agent-sandbox serve`.

The SDK gates file metadata (0.6.2), watch entry info (0.6.3) and `allow_network_mounts` (0.6.4) on the
envd version the control plane reports, so each of these only works end to end when that version is right.
"""

from __future__ import annotations

import httpx
from e2b import EntryInfo, FileType, Sandbox

from executor.envd import ENVD_VERSION
from tests.polling import wait_for


def test_the_reported_envd_version_is_the_one_the_executor_serves(sbx: Sandbox) -> None:
    assert sbx.get_info().envd_version == ENVD_VERSION == "0.6.4"


def test_file_metadata_round_trips_through_write_get_info_and_list(sbx: Sandbox) -> None:
    written = sbx.files.write("/home/user/report.csv", "a,b\n", metadata={"Author": "alice", "stage": "draft"})
    assert written.metadata == {"author": "alice", "stage": "draft"}
    assert sbx.files.get_info("/home/user/report.csv").metadata == written.metadata
    listed = {entry.name: entry.metadata for entry in sbx.files.list("/home/user")}
    assert listed["report.csv"] == written.metadata
    sbx.files.write("/home/user/report.csv", "a,b\n1,2\n", metadata={"stage": "final"})
    assert sbx.files.get_info("/home/user/report.csv").metadata == {"stage": "final"}


def test_watch_with_include_entry_gets_the_entry_of_each_event(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/inbox")
    handle = sbx.files.watch_dir("/home/user/inbox", include_entry=True, allow_network_mounts=True)
    try:
        sbx.files.write("/home/user/inbox/job.json", "{}")
        entries: list[EntryInfo] = []

        def arrived() -> bool:
            entries.extend(event.entry for event in handle.get_new_events() if event.entry is not None)
            return bool(entries)

        wait_for(arrived, what="an event with its entry")
        assert (entries[0].path, entries[0].type, entries[0].owner) == (
            "/home/user/inbox/job.json",
            FileType.FILE,
            "user",
        )
    finally:
        handle.stop()


def test_remove_of_a_missing_path_does_not_raise(sbx: Sandbox) -> None:
    sbx.files.remove("/home/user/never-existed.txt")
    assert not sbx.files.exists("/home/user/never-existed.txt")


def test_a_symlink_reports_its_target(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/data/real.txt", "x")
    sbx.commands.run("ln -s /home/user/data/real.txt /home/user/link.txt && ln -s /home/user/data /home/user/dir")
    link = sbx.files.get_info("/home/user/link.txt")
    assert (link.type, link.symlink_target) == (FileType.SYMLINK, "/home/user/data/real.txt")
    listed = {entry.name: (entry.type, entry.symlink_target) for entry in sbx.files.list("/home/user")}
    assert listed["dir"] == (FileType.SYMLINK, "/home/user/data")
    assert sbx.files.list("/home/user/dir")[0].name == "real.txt"  # listing through the link lists the target


def test_envds_own_metrics_inside_show_the_templates_limits(sbx: Sandbox) -> None:
    """`base` is 1 CPU and 1024 MiB: envd's /metrics answers the sandbox's own cgroup figures, not the host's."""
    headers = {"X-Access-Token": sbx._envd_access_token or ""}  # what the SDK itself sends to envd
    metrics = httpx.get(f"{sbx.envd_api_url}/metrics", headers=headers | _routing(sbx), timeout=30).json()
    assert (metrics["cpu_count"], metrics["mem_total_mib"]) == (1, 1024)
    assert 0 < metrics["mem_used"] < metrics["mem_total"]


def _routing(sbx: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
