"""The agent server's fs, config, process and desktop routes (sandbox-agent 0.4.2's, coding-agents.md §2), over HTTP.

A real executor on this host (commands and files as root, its home a scratch directory); each test works in its own
temporary directory. Errors are problem documents (`application/problem+json`, `urn:sandbox-agent:error:<kind>`).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agent_fixtures import AgentServer, Frame, read_sse, run_agent_server, sse_fields
from tests.polling import wait_for

OCTETS = {"Content-Type": "application/octet-stream"}
DEFAULT_CONFIG = {
    "maxConcurrentProcesses": 64,
    "defaultRunTimeoutMs": 30000,
    "maxRunTimeoutMs": 300000,
    "maxOutputBytes": 1048576,
    "maxLogBytesPerProcess": 10485760,
    "maxInputBytesPerRequest": 65536,
}


@pytest.fixture(scope="module")
def agents() -> Iterator[AgentServer]:
    with run_agent_server() as server:
        yield server


@pytest.fixture
def client(agents: AgentServer) -> Iterator[httpx.Client]:
    with agents.client() as client:
        yield client


def _problem(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:sandbox-agent:error:{kind}"
    assert body["status"] == status
    assert body["detail"]
    return body


def _put(client: httpx.Client, path: Path | str, data: bytes) -> httpx.Response:
    return client.put("/v1/fs/file", params={"path": str(path)}, content=data, headers=OCTETS)


# ---- /v1/fs -----------------------------------------------------------------------------------------------------


def test_a_file_is_written_read_back_listed_and_statted(client: httpx.Client, tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.bin"
    data = b"\x00binary\xffbytes\n"
    written = _put(client, target, data)
    assert written.json() == {"path": str(target), "bytesWritten": len(data)}
    assert target.read_bytes() == data  # the parents were created
    read = client.get("/v1/fs/file", params={"path": str(target)})
    assert read.headers["content-type"] == "application/octet-stream"
    assert read.content == data
    assert _put(client, target, b"shorter").json()["bytesWritten"] == 7  # a rewrite truncates
    assert target.read_bytes() == b"shorter"

    stat = client.get("/v1/fs/stat", params={"path": str(target)}).json()
    assert {k: stat[k] for k in ("path", "entryType", "size")} == {"path": str(target), "entryType": "file", "size": 7}
    assert stat["modified"].endswith("Z")
    assert client.get("/v1/fs/stat", params={"path": str(tmp_path / "a")}).json()["entryType"] == "directory"

    (tmp_path / "z.txt").write_text("zz")
    entries = client.get("/v1/fs/entries", params={"path": str(tmp_path)}).json()
    assert [(e["name"], e["path"], e["entryType"]) for e in entries] == [
        ("a", str(tmp_path / "a"), "directory"),
        ("z.txt", str(tmp_path / "z.txt"), "file"),
    ]
    assert entries[1]["size"] == 2


def test_relative_paths_and_no_path_mean_the_users_home(client: httpx.Client) -> None:
    written = _put(client, "relative-note.txt", b"at home").json()
    home = os.path.dirname(written["path"])
    assert os.path.isabs(written["path"])
    assert Path(written["path"]).read_bytes() == b"at home"
    listed = client.get("/v1/fs/entries").json()
    assert {"name": "relative-note.txt", "path": written["path"]}.items() <= next(
        entry for entry in listed if entry["name"] == "relative-note.txt"
    ).items()
    assert client.get("/v1/fs/file", params={"path": "~/relative-note.txt"}).content == b"at home"
    assert client.delete("/v1/fs/entry", params={"path": "relative-note.txt"}).json() == {
        "path": os.path.join(home, "relative-note.txt")
    }
    assert not os.path.exists(written["path"])


def test_mkdir_makes_the_parents_and_says_where(client: httpx.Client, tmp_path: Path) -> None:
    target = tmp_path / "x" / "y" / "z"
    assert client.post("/v1/fs/mkdir", params={"path": str(target)}).json() == {"path": str(target)}
    assert target.is_dir()
    assert client.post("/v1/fs/mkdir", params={"path": str(target)}).status_code == 200  # already there
    (tmp_path / "file").write_text("")
    _problem(client.post("/v1/fs/mkdir", params={"path": str(tmp_path / "file" / "sub")}), 400, "invalid_request")


def test_move_refuses_to_overwrite_unless_asked(client: httpx.Client, tmp_path: Path) -> None:
    source, target = tmp_path / "source.txt", tmp_path / "target.txt"
    source.write_text("new")
    target.write_text("old")
    refused = client.post("/v1/fs/move", json={"from": str(source), "to": str(target)})
    assert "overwrite" in _problem(refused, 409, "conflict")["detail"]
    assert (source.read_text(), target.read_text()) == ("new", "old")  # nothing moved
    _problem(
        client.post("/v1/fs/move", json={"from": str(source), "to": str(target), "overwrite": False}), 409, "conflict"
    )

    moved = client.post("/v1/fs/move", json={"from": str(source), "to": str(target), "overwrite": True})
    assert moved.json() == {"from": str(source), "to": str(target)}
    assert not source.exists()
    assert target.read_text() == "new"

    deeper = tmp_path / "new" / "dir" / "moved.txt"
    assert client.post("/v1/fs/move", json={"from": str(target), "to": str(deeper)}).status_code == 200
    assert deeper.read_text() == "new"
    _problem(client.post("/v1/fs/move", json={"from": str(target), "to": str(source)}), 400, "invalid_request")
    into_itself = client.post("/v1/fs/move", json={"from": str(tmp_path / "new"), "to": str(tmp_path / "new/sub/x")})
    assert "into itself" in _problem(into_itself, 400, "invalid_request")["detail"]
    assert not (tmp_path / "new" / "sub").exists()  # refused before any parent was made
    _problem(client.post("/v1/fs/move", content=b"{}", headers=OCTETS), 415, "unsupported_media_type")
    _problem(client.post("/v1/fs/move", json={"to": str(source)}), 400, "invalid_request")


def test_a_directory_with_content_is_deleted_only_when_recursive(client: httpx.Client, tmp_path: Path) -> None:
    full = tmp_path / "full"
    (full / "inner").mkdir(parents=True)
    (full / "inner" / "file.txt").write_text("keep me")
    refused = client.delete("/v1/fs/entry", params={"path": str(full)})
    assert "not empty" in _problem(refused, 400, "invalid_request")["detail"]
    assert (full / "inner" / "file.txt").read_text() == "keep me"
    _problem(client.delete("/v1/fs/entry", params={"path": str(full), "recursive": "false"}), 400, "invalid_request")
    assert client.delete("/v1/fs/entry", params={"path": str(full), "recursive": "true"}).json() == {"path": str(full)}
    assert not full.exists()

    (tmp_path / "empty").mkdir()
    assert client.delete("/v1/fs/entry", params={"path": str(tmp_path / "empty")}).status_code == 200
    assert not (tmp_path / "empty").exists()

    outside = tmp_path / "outside"
    (outside / "kept").mkdir(parents=True)
    (tmp_path / "link").symlink_to(outside)
    assert (
        client.delete("/v1/fs/entry", params={"path": str(tmp_path / "link"), "recursive": "true"}).status_code == 200
    )
    assert not (tmp_path / "link").is_symlink()
    assert (outside / "kept").is_dir()  # a link is removed, not what it points at


def test_a_missing_path_is_a_400_problem(client: httpx.Client, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    for response in (
        client.get("/v1/fs/file", params={"path": missing}),
        client.get("/v1/fs/stat", params={"path": missing}),
        client.get("/v1/fs/entries", params={"path": missing}),
        client.delete("/v1/fs/entry", params={"path": missing}),
    ):
        assert missing in _problem(response, 400, "invalid_request")["detail"]
    assert "path" in _problem(client.get("/v1/fs/file"), 400, "invalid_request")["detail"]  # no ?path at all
    _problem(client.get("/v1/fs/file", params={"path": str(tmp_path)}), 400, "invalid_request")  # a directory
    _problem(_put(client, tmp_path, b"x"), 400, "invalid_request")


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


def _upload(client: httpx.Client, root: Path, body: bytes) -> httpx.Response:
    return client.post(
        "/v1/fs/upload-batch", params={"path": str(root)}, content=body, headers={"Content-Type": "application/x-tar"}
    )


def test_upload_batch_unpacks_files_and_directories_under_the_path(client: httpx.Client, tmp_path: Path) -> None:
    root = tmp_path / "unpacked"
    body = _tar(
        (_member("dir", tarfile.DIRTYPE, 0o755), None),
        (_member("dir/script.sh", mode=0o4755), b"#!/bin/sh\necho hi\n"),
        (_member("./top.txt"), b"top"),
        (_member("empty", tarfile.DIRTYPE), None),
    )
    answer = _upload(client, root, body).json()
    assert answer == {"paths": [str(root / "dir" / "script.sh"), str(root / "top.txt")], "truncated": False}
    assert (root / "dir" / "script.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert (root / "dir" / "script.sh").stat().st_mode & 0o7777 == 0o755  # the setuid bit is dropped
    assert (root / "top.txt").read_text() == "top"
    assert (root / "empty").is_dir()


@pytest.mark.parametrize(
    "refused",
    [
        _member("../escaped.txt"),
        _member("inner/../../escaped.txt"),
        _member("/abs/escaped.txt"),
        _member("escaped.txt", tarfile.SYMTYPE, link="/etc/passwd"),
        _member("escaped.txt", tarfile.LNKTYPE, link="good.txt"),
    ],
    ids=["dotdot", "dotdot-inside", "absolute", "symlink", "hardlink"],
)
def test_upload_batch_refuses_a_tar_with_a_member_that_is_not_a_plain_relative_file(
    client: httpx.Client, tmp_path: Path, refused: tarfile.TarInfo
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    data = None if refused.type in (tarfile.SYMTYPE, tarfile.LNKTYPE) else b"escaped"
    body = _tar((_member("good.txt"), b"good"), (refused, data))
    detail = _problem(_upload(client, root, body), 400, "invalid_request")["detail"]
    assert repr(refused.name) in detail
    assert os.listdir(root) == []  # refused whole: not even the good member
    assert not (tmp_path / "escaped.txt").exists()


def test_upload_batch_refuses_what_is_not_a_tar(client: httpx.Client, tmp_path: Path) -> None:
    assert "not a tar" in _problem(_upload(client, tmp_path, b"plain text, no tar"), 400, "invalid_request")["detail"]
    assert os.listdir(tmp_path) == []


# ---- /v1/config -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "name_parameter", "entry"),
    [
        ("mcp", "mcpName", {"type": "local", "command": "npx", "args": ["-y", "server-fs"], "env": {"A": "1"}}),
        ("skills", "skillName", {"sources": [{"type": "github", "source": "owner/repo", "ref": "main"}]}),
    ],
)
def test_config_entries_are_stored_by_name_in_the_directory(
    client: httpx.Client, tmp_path: Path, kind: str, name_parameter: str, entry: dict[str, Any]
) -> None:
    route = f"/v1/config/{kind}"

    def where(name: str) -> dict[str, str]:
        return {"directory": str(tmp_path), name_parameter: name}

    missing = _problem(client.get(route, params=where("first")), 404, "session_not_found")
    assert missing["sessionId"] == f"{kind}:first"
    assert f"{kind}:first" in missing["detail"]

    stored = client.put(route, params=where("first"), json=entry)
    assert (stored.status_code, stored.content) == (204, b"")
    assert client.put(route, params=where("second"), json={"other": True}).status_code == 204
    assert client.get(route, params=where("first")).json() == entry
    on_disk = json.loads((tmp_path / ".sandbox-agent" / "config" / f"{kind}.json").read_text())
    assert on_disk == {"first": entry, "second": {"other": True}}

    assert client.put(route, params=where("first"), json={"replaced": 1}).status_code == 204
    assert client.get(route, params=where("first")).json() == {"replaced": 1}
    assert client.delete(route, params=where("first")).status_code == 204
    _problem(client.get(route, params=where("first")), 404, "session_not_found")
    assert client.get(route, params=where("second")).json() == {"other": True}  # the other entry stays
    assert client.delete(route, params=where("first")).status_code == 204  # deleting a missing one is no error

    _problem(client.get(route, params={"directory": str(tmp_path)}), 400, "invalid_request")
    _problem(client.get(route, params={name_parameter: "first"}), 400, "invalid_request")
    _problem(client.put(route, params=where("bad"), json=[1, 2]), 400, "invalid_request")
    _problem(
        client.put(route, params=where("bad"), content=b"{nope", headers={"Content-Type": "application/json"}),
        400,
        "invalid_request",
    )
    _problem(client.put(route, params=where("bad"), content=b"{}", headers=OCTETS), 415, "unsupported_media_type")
    _problem(client.get(route, params=where("bad")), 404, "session_not_found")  # no refused PUT was stored

    (tmp_path / ".sandbox-agent" / "config" / f"{kind}.json.tmp").mkdir()  # where the new file is written first
    unwritable = _problem(client.put(route, params=where("third"), json={}), 400, "invalid_request")
    assert f"{kind}.json" in unwritable["detail"]
    assert client.get(route, params=where("second")).json() == {"other": True}  # the stored file is intact


# ---- /v1/processes ----------------------------------------------------------------------------------------------


def _run(client: httpx.Client, **body: Any) -> dict[str, Any]:
    answer = client.post("/v1/processes/run", json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def test_run_returns_the_exit_code_and_both_outputs(client: httpx.Client, tmp_path: Path) -> None:
    result = _run(
        client,
        command="sh",
        args=["-c", 'pwd; echo "$GREETING"; echo oops >&2; exit 3'],
        cwd=str(tmp_path),
        env={"GREETING": "hello"},
    )
    assert result["exitCode"] == 3
    assert result["stdout"] == f"{tmp_path}\nhello\n"
    assert result["stderr"] == "oops\n"
    assert (result["timedOut"], result["stdoutTruncated"], result["stderrTruncated"]) == (False, False, False)
    assert isinstance(result["durationMs"], int)

    truncated = _run(client, command="sh", args=["-c", "printf 0123456789"], maxOutputBytes=4)
    assert (truncated["stdout"], truncated["stdoutTruncated"], truncated["exitCode"]) == ("0123", True, 0)


def test_run_past_its_timeout_is_killed_and_says_so(client: httpx.Client, tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    result = _run(client, command="sh", args=["-c", f"echo started; sleep 30; touch {marker}"], timeoutMs=500)
    assert result["timedOut"] is True
    assert result["exitCode"] is None
    assert result["stdout"] == "started\n"
    assert not marker.exists()


def test_run_refuses_a_timeout_past_the_limit_and_an_unknown_command(client: httpx.Client) -> None:
    over = client.post("/v1/processes/run", json={"command": "true", "timeoutMs": 300_001})
    assert "timeoutMs" in _problem(over, 400, "invalid_request")["detail"]
    _problem(client.post("/v1/processes/run", json={"args": ["x"]}), 400, "invalid_request")  # no command
    unknown = client.post("/v1/processes/run", json={"command": "no-such-command-anywhere"})
    assert "no-such-command-anywhere" in _problem(unknown, 400, "invalid_request")["detail"]
    _problem(client.post("/v1/processes", json={"command": "true", "cwd": "/no/such/dir"}), 400, "invalid_request")


def _wait_exited(client: httpx.Client, process_id: str) -> dict[str, Any]:
    def exited() -> dict[str, Any] | None:
        info: dict[str, Any] = client.get(f"/v1/processes/{process_id}").json()
        return info if info["status"] == "exited" else None

    return wait_for(exited, what=f"{process_id} to exit")


def _texts(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    assert all(entry["encoding"] == "base64" for entry in entries)
    return [(entry["stream"], base64.b64decode(entry["data"]).decode()) for entry in entries]


def _joined(entries: list[dict[str, Any]], stream: str) -> str:
    return "".join(text for name, text in _texts(entries) if name == stream)


def test_a_created_process_keeps_its_logs_by_stream(client: httpx.Client, tmp_path: Path) -> None:
    created = client.post(
        "/v1/processes",
        json={"command": "sh", "args": ["-c", "echo one; echo two >&2; echo three"], "cwd": str(tmp_path)},
    ).json()
    assert created["id"].startswith("proc_")
    assert {k: created[k] for k in ("command", "args", "tty", "interactive", "owner")} == {
        "command": "sh",
        "args": ["-c", "echo one; echo two >&2; echo three"],
        "tty": False,
        "interactive": False,
        "owner": "user",
    }
    assert isinstance(created["pid"], int)
    exited = _wait_exited(client, created["id"])
    assert exited["exitCode"] == 0
    assert exited["exitedAtMs"] >= exited["createdAtMs"]
    logs = f"/v1/processes/{created['id']}/logs"

    combined = client.get(logs).json()
    assert (combined["processId"], combined["stream"]) == (created["id"], "combined")
    entries = combined["entries"]
    assert [entry["sequence"] for entry in entries] == sorted({entry["sequence"] for entry in entries})
    assert len(entries) >= 2  # one per read of a pipe: stdout's two lines may come as one
    assert _joined(entries, "stdout") == "one\nthree\n"
    assert _joined(entries, "stderr") == "two\n"
    only_stdout = client.get(logs, params={"stream": "stdout"}).json()["entries"]
    assert only_stdout == [entry for entry in entries if entry["stream"] == "stdout"]
    assert _texts(client.get(logs, params={"stream": "stderr"}).json()["entries"]) == [("stderr", "two\n")]
    assert client.get(logs, params={"tail": "1"}).json()["entries"] == entries[-1:]
    assert client.get(logs, params={"since": str(entries[0]["sequence"])}).json()["entries"] == entries[1:]
    _problem(client.get(logs, params={"stream": "nosuch"}), 400, "invalid_request")

    listed = client.get("/v1/processes").json()["processes"]
    assert created["id"] in {process["id"] for process in listed}
    assert client.get("/v1/processes", params={"owner": "desktop"}).json() == {"processes": []}
    assert client.delete(f"/v1/processes/{created['id']}").status_code == 204
    _problem(client.get(f"/v1/processes/{created['id']}"), 404, "not_found")
    _problem(client.get(logs), 404, "not_found")


def _decoded(frame: Frame) -> str:
    return base64.b64decode(frame.data["data"]).decode()


def test_input_reaches_an_interactive_process_and_its_followed_logs_end_when_it_stops(
    client: httpx.Client, agents: AgentServer
) -> None:
    created = client.post("/v1/processes", json={"command": "cat", "interactive": True}).json()
    process = f"/v1/processes/{created['id']}"
    written = client.post(f"{process}/input", json={"data": base64.b64encode(b"first\n").decode()})
    assert written.json() == {"bytesWritten": 6}
    assert client.post(f"{process}/input", json={"data": "second\n", "encoding": "utf8"}).json() == {"bytesWritten": 7}

    def echoed() -> list[dict[str, Any]] | None:
        entries: list[dict[str, Any]] = client.get(f"{process}/logs").json()["entries"]
        return entries if "".join(text for _, text in _texts(entries)) == "first\nsecond\n" else None

    seen = wait_for(echoed, what="cat to echo its input")
    _problem(client.post(f"{process}/input", json={"data": "not base64!"}), 400, "invalid_request")
    _problem(client.post(f"{process}/input", json={"data": "x", "encoding": "rot13"}), 400, "invalid_request")
    _problem(client.post(f"{process}/terminal/resize", json={"cols": 100, "rows": 40}), 409, "conflict")  # no tty
    not_interactive = client.post("/v1/processes", json={"command": "sleep", "args": ["300"]}).json()
    no_stdin = client.post(f"/v1/processes/{not_interactive['id']}/input", json={"data": "eAo="})
    assert "stdin" in _problem(no_stdin, 400, "invalid_request")["detail"]
    assert client.delete(f"/v1/processes/{not_interactive['id']}").status_code == 204

    # The backlog (everything so far), as SSE frames named `log`, with the sequence as their id.
    replayed = read_sse(
        client, "GET", f"{process}/logs", until=lambda f: f.id == seen[-1]["sequence"], params={"follow": "true"}
    )
    assert {frame.event for frame in replayed} == {"log"}
    assert "".join(_decoded(frame) for frame in replayed) == "first\nsecond\n"

    # From `since` on: nothing old, then what the process writes while the stream is open, then the end.
    last = seen[-1]["sequence"]
    with (
        agents.client() as other,
        client.stream(
            "GET",
            f"{process}/logs",
            params={"follow": "true", "since": str(last)},
            headers={"Accept": "text/event-stream"},
        ) as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert other.post(f"{process}/input", json={"data": "live\n", "encoding": "utf8"}).status_code == 200
        frames: list[dict[str, str]] = []
        for fields in sse_fields(stream.iter_lines()):
            frames.append(fields)
            if len(frames) == 1:
                stopped = other.post(f"{process}/stop", params={"waitMs": "30000"}).json()
                assert stopped["status"] == "exited"
                assert stopped["exitCode"] == -1  # SIGTERM
        # The stream ended on its own once the process had exited.
    assert [int(frame["id"]) for frame in frames] == [last + 1]
    assert base64.b64decode(json.loads(frames[0]["data"])["data"]) == b"live\n"

    after = client.post(f"{process}/input", json={"data": "late\n", "encoding": "utf8"})
    _problem(after, 409, "conflict")
    assert client.post(f"{process}/kill").json()["status"] == "exited"  # nothing left to kill: no error
    assert client.delete(process).status_code == 204


def test_a_process_is_stopped_killed_or_deleted_with_its_whole_group(client: httpx.Client, tmp_path: Path) -> None:
    def start(name: str) -> dict[str, Any]:
        # The shell stays (a trap keeps it from exec'ing sleep), its child sleeps: both must go.
        script = f"trap 'exit 7' TERM; echo $$ > {tmp_path / name}; sleep 300 & wait"
        info: dict[str, Any] = client.post("/v1/processes", json={"command": "sh", "args": ["-c", script]}).json()
        wait_for(lambda: (tmp_path / name).exists() and (tmp_path / name).read_text().strip(), what="the shell")
        return info

    stopped = start("stopped")
    info = client.post(f"/v1/processes/{stopped['id']}/stop", params={"waitMs": "30000"}).json()
    assert (info["status"], info["exitCode"]) == ("exited", 7)  # SIGTERM, which the shell's trap saw

    killed = start("killed")
    info = client.post(f"/v1/processes/{killed['id']}/kill", params={"waitMs": "30000"}).json()
    assert (info["status"], info["exitCode"]) == ("exited", -1)

    deleted = start("deleted")
    assert client.delete(f"/v1/processes/{deleted['id']}").status_code == 204
    _problem(client.get(f"/v1/processes/{deleted['id']}"), 404, "not_found")
    wait_for(lambda: not _alive(deleted["pid"]), what="the deleted process to be gone")
    _problem(client.post("/v1/processes/proc_999999/stop"), 404, "not_found")
    _problem(client.delete("/v1/processes/proc_999999"), 404, "not_found")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_process_config_is_checked_and_its_limits_hold(client: httpx.Client) -> None:
    assert client.get("/v1/processes/config").json() == DEFAULT_CONFIG
    try:
        for bad in (
            {"maxConcurrentProcesses": 0},
            {"maxRunTimeoutMs": 1000, "defaultRunTimeoutMs": 2000},
            {"maxOutputBytes": 10**12},
        ):
            _problem(client.post("/v1/processes/config", json=DEFAULT_CONFIG | bad), 400, "invalid_request")
        assert client.get("/v1/processes/config").json() == DEFAULT_CONFIG  # nothing refused was kept
        _problem(client.post("/v1/processes/config", json={"nosuch": 1}), 400, "invalid_request")

        tight = DEFAULT_CONFIG | {"maxConcurrentProcesses": 1, "maxRunTimeoutMs": 1000, "defaultRunTimeoutMs": 500}
        tight |= {"maxInputBytesPerRequest": 4}
        assert client.post("/v1/processes/config", json=tight).json() == tight
        _problem(client.post("/v1/processes/run", json={"command": "true", "timeoutMs": 1001}), 400, "invalid_request")
        assert _run(client, command="sleep", args=["30"])["timedOut"] is True  # the new default timeout
        running = client.post("/v1/processes", json={"command": "cat", "interactive": True}).json()
        _problem(client.post("/v1/processes", json={"command": "true"}), 409, "conflict")
        too_big = client.post(f"/v1/processes/{running['id']}/input", json={"data": "12345", "encoding": "utf8"})
        _problem(too_big, 413, "payload_too_large")
        assert client.delete(f"/v1/processes/{running['id']}").status_code == 204
        second = client.post("/v1/processes", json={"command": "true"})  # room again
        assert second.status_code == 200, second.text
        _wait_exited(client, second.json()["id"])
    finally:
        assert client.post("/v1/processes/config", json=DEFAULT_CONFIG).status_code == 200


def test_a_tty_process_is_resized_and_takes_input_on_its_pty(client: httpx.Client) -> None:
    script = "read line; echo got $line; stty size"
    created = client.post("/v1/processes", json={"command": "sh", "args": ["-c", script], "tty": True}).json()
    assert (created["tty"], created["interactive"]) == (True, False)
    process = f"/v1/processes/{created['id']}"
    assert client.post(f"{process}/terminal/resize", json={"cols": 132, "rows": 43}).json() == {"cols": 132, "rows": 43}
    assert client.post(f"{process}/input", json={"data": "hello\n", "encoding": "utf8"}).json() == {"bytesWritten": 6}
    assert _wait_exited(client, created["id"])["exitCode"] == 0
    entries = client.get(f"{process}/logs", params={"stream": "pty"}).json()["entries"]
    output = _joined(entries, "pty")
    assert "got hello\r\n" in output
    assert "43 132\r\n" in output
    _problem(client.post(f"{process}/terminal/resize", json={"cols": 80, "rows": 24}), 409, "conflict")  # exited


# ---- the ACP servers' log files --------------------------------------------------------------------------------


def test_an_acp_stream_that_lags_behind_a_delete_still_gets_every_event_and_the_end(
    client: httpx.Client, agents: AgentServer
) -> None:
    acp = {"Content-Type": "application/json", "Accept": "application/json"}

    def rpc(body: dict[str, Any], query: str = "") -> dict[str, Any]:
        answer = client.post(f"/v1/acp/lagging{query}", json={"jsonrpc": "2.0", **body}, headers=acp)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()["result"]
        return result

    rpc({"id": 0, "method": "initialize", "params": {"protocolVersion": 1}}, "?agent=mock")
    session_id = rpc({"id": 1, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}})["sessionId"]
    # Far more events than the kernel buffers between the server and a client that does not read (tcp_wmem's
    # maximum plus the receive window), so the stream is still being written when the server is deleted.
    send_buffer = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    words = max(30_000, 3 * send_buffer // 100)  # two events (thought and reply) of about 200 bytes per 3 words
    text = " ".join(f"w{n}" for n in range(words))
    prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
    assert rpc({"id": 2, "method": "session/prompt", "params": prompt})["stopReason"] == "end_turn"

    ids: list[int] = []
    last: dict[str, Any] = {}
    with (
        agents.client() as other,
        client.stream("GET", "/v1/acp/lagging", headers={"Accept": "text/event-stream"}) as stream,
    ):
        lines = stream.iter_lines()
        assert next(lines) == "event: message"  # the stream runs; from here on nothing reads it for a while
        assert other.delete("/v1/acp/lagging").status_code == 204
        for line in lines:
            if line.startswith("id: "):
                ids.append(int(line[4:]))
            elif line.startswith("data: "):
                last = json.loads(line[6:])
    assert ids == list(range(1, len(ids) + 1))
    assert len(ids) > 2 * words // 3
    assert last["method"] == "_adapter/agent_exited"  # the stream ended as a stream of a closed server ends


# ---- /v1/desktop ------------------------------------------------------------------------------------------------


def test_without_a_display_the_desktop_is_inactive_and_its_routes_are_409(client: httpx.Client) -> None:
    if Path("/tmp/.X11-unix/X0").exists():
        pytest.skip("this host has an X display on :0, which the executor reports as the sandbox's desktop")
    status = client.get("/v1/desktop/status").json()
    assert status["state"] == "inactive"
    assert status["missingDependencies"] == [c for c in ("Xvfb", "xdotool", "scrot") if shutil.which(c) is None]
    for method, path in (
        ("POST", "/v1/desktop/start"),
        ("GET", "/v1/desktop/screenshot"),
        ("POST", "/v1/desktop/mouse/click"),
    ):
        _problem(client.request(method, path), 409, "desktop_runtime_inactive")
    _problem(client.post("/v1/desktop/status"), 405, "invalid_request")
