"""The Connect protocol on the wire: envelopes, end-of-stream, error shapes, deadlines, keepalives."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.executor_fixtures import Envd, envd_fixture, workdir_fixture  # noqa: F401 - fixtures

STREAM = "application/connect+json"
Frame = tuple[int, dict[str, Any]]


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def frames(response: httpx.Response) -> Iterator[Frame]:
    """Decode the envelopes of a streaming response as they arrive."""
    buffer = b""
    for chunk in response.iter_raw():
        buffer += chunk
        while len(buffer) >= 5:
            flags, size = struct.unpack(">BI", buffer[:5])
            if len(buffer) < 5 + size:
                break
            yield flags, json.loads(buffer[5 : 5 + size])
            buffer = buffer[5 + size :]
    assert buffer == b"", "stream ended inside an envelope"


def bash(script: str, **extra: Any) -> dict[str, Any]:
    return {"process": {"cmd": "/bin/bash", "args": ["-c", script]}, "stdin": False, **extra}


def stream_call(envd: Envd, method: str, *messages: dict[str, Any], **headers: str) -> list[Frame]:
    with envd.client() as client:
        body = b"".join(envelope(message) for message in messages)
        request_headers = {"Content-Type": STREAM} | headers
        with client.stream("POST", method, content=iter([body]), headers=request_headers) as response:
            assert (response.status_code, response.headers["content-type"]) == (200, STREAM)
            return list(frames(response))


def test_start_streams_start_data_end_then_an_empty_end_of_stream(envd: Envd) -> None:
    received = stream_call(envd, "/process.Process/Start", bash("printf hi"))
    assert [flags for flags, _ in received] == [0, 0, 0, 2]
    assert set(received[0][1]["event"]) == {"start"}
    assert received[1][1] == {"event": {"data": {"stdout": base64.b64encode(b"hi").decode()}}}
    assert received[2][1] == {"event": {"end": {"exited": True, "status": "exit status 0"}}}
    assert received[3][1] == {}


def test_exit_code_and_error_are_in_the_end_event(envd: Envd) -> None:
    end = stream_call(envd, "/process.Process/Start", bash("exit 7"))[-2][1]["event"]["end"]
    assert end == {"exitCode": 7, "exited": True, "status": "exit status 7", "error": "exit status 7"}


def test_stream_errors_arrive_in_the_end_of_stream_message(envd: Envd) -> None:
    received = stream_call(envd, "/process.Process/Connect", {"process": {"pid": 999999}})
    assert received == [(2, {"error": {"code": "not_found", "message": "process with pid 999999 not found"}})]


def test_expired_deadline_ends_the_stream_with_deadline_exceeded(envd: Envd) -> None:
    received = stream_call(envd, "/process.Process/Start", bash("sleep 30"), **{"Connect-Timeout-Ms": "300"})
    assert received[-1] == (2, {"error": {"code": "deadline_exceeded", "message": "deadline of 300 ms exceeded"}})


def test_idle_streams_get_keepalives_at_the_requested_interval(envd: Envd) -> None:
    with envd.client() as client:
        body = envelope(bash("sleep 30"))
        headers = {"Content-Type": STREAM, "Keepalive-Ping-Interval": "0.05", "Connect-Timeout-Ms": "5000"}
        with client.stream("POST", "/process.Process/Start", content=iter([body]), headers=headers) as response:
            received = frames(response)
            pid = next(received)[1]["event"]["start"]["pid"]
            assert next(received) == (0, {"event": {"keepalive": {}}})
            assert next(received) == (0, {"event": {"keepalive": {}}})
        kill = {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
        assert client.post("/process.Process/SendSignal", json=kill).json() == {}


def test_stream_input_answers_one_empty_message_then_end_of_stream(envd: Envd) -> None:
    with envd.client() as client:
        start = bash("cat", stdin=True)
        with client.stream(
            "POST", "/process.Process/Start", content=iter([envelope(start)]), headers={"Content-Type": STREAM}
        ) as response:
            events = frames(response)
            pid = next(events)[1]["event"]["start"]["pid"]
            received = stream_call(
                envd,
                "/process.Process/StreamInput",
                {"start": {"process": {"pid": pid}}},
                {"data": {"input": {"stdin": base64.b64encode(b"piped").decode()}}},
            )
            assert received == [(0, {}), (2, {})]
            assert client.post("/process.Process/CloseStdin", json={"process": {"pid": pid}}).json() == {}
            assert next(events) == (0, {"event": {"data": {"stdout": base64.b64encode(b"piped").decode()}}})


def test_unary_success_is_json_and_empty_messages_are_braces(envd: Envd, workdir: str) -> None:
    with envd.client() as client:
        client.post("/filesystem.Filesystem/MakeDir", json={"path": f"{workdir}/d"})
        response = client.post("/filesystem.Filesystem/Remove", json={"path": f"{workdir}/d"})
    assert (response.status_code, response.headers["content-type"], response.content) == (
        200,
        "application/json",
        b"{}",
    )


def test_unary_errors_carry_the_connect_code_and_its_http_status(envd: Envd, workdir: str) -> None:
    with envd.client() as client:
        response = client.post("/filesystem.Filesystem/Stat", json={"path": f"{workdir}/nope"})
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_int64_is_a_string_and_fields_are_camel_case(envd: Envd, workdir: str) -> None:
    envd.sandbox().files.write(f"{workdir}/sized", "12345")
    with envd.client() as client:
        entry = client.post("/filesystem.Filesystem/Stat", json={"path": f"{workdir}/sized"}).json()["entry"]
    assert entry["size"] == "5"
    assert {"modifiedTime", "permissions", "owner"} <= set(entry)


def test_snake_case_and_string_numbers_are_accepted(envd: Envd, workdir: str) -> None:
    with envd.client() as client:
        client.post("/filesystem.Filesystem/MakeDir", json={"path": f"{workdir}/a/b"})
        listed = client.post("/filesystem.Filesystem/ListDir", json={"path": workdir, "depth": "2"}).json()
        watcher = client.post("/filesystem.Filesystem/CreateWatcher", json={"path": workdir, "include_entry": True})
        watcher_id = watcher.json()["watcherId"]
        removed = client.post("/filesystem.Filesystem/RemoveWatcher", json={"watcher_id": watcher_id})
    assert [entry["name"] for entry in listed["entries"]] == ["a", "b"]
    assert removed.json() == {}


def test_malformed_json_is_invalid_argument(envd: Envd) -> None:
    with envd.client() as client:
        response = client.post(
            "/filesystem.Filesystem/Stat", content=b"{not json", headers={"Content-Type": "application/json"}
        )
    assert (response.status_code, response.json()["code"]) == (400, "invalid_argument")


def test_wrong_field_types_are_invalid_argument(envd: Envd) -> None:
    with envd.client() as client:
        response = client.post("/filesystem.Filesystem/Stat", json={"path": 5})
    assert (response.status_code, response.json()["code"]) == (400, "invalid_argument")


def test_unknown_method_is_404_unimplemented(envd: Envd) -> None:
    with envd.client() as client:
        response = client.post("/process.Process/Teleport", json={})
        other = client.post("/nosuch.Service/Method", json={})
    assert (response.status_code, response.json()["code"]) == (404, "unimplemented")
    assert other.status_code == 404


@pytest.mark.parametrize(
    ("content_type", "extra"),
    [("application/proto", {}), ("application/json", {"Content-Encoding": "gzip"})],
)
def test_unsupported_codec_or_compression_is_unimplemented(
    envd: Envd, content_type: str, extra: dict[str, str]
) -> None:
    with envd.client() as client:
        response = client.post("/process.Process/List", content=b"{}", headers={"Content-Type": content_type} | extra)
    assert response.json()["code"] == "unimplemented"


def test_a_stream_request_needs_exactly_one_message(envd: Envd) -> None:
    received = stream_call(envd, "/process.Process/Connect", {"process": {"pid": 1}}, {"process": {"pid": 2}})
    assert received[-1][1]["error"]["code"] == "invalid_argument"


def test_sigterm_ends_a_process_with_status_terminated(envd: Envd) -> None:
    with envd.client() as client:
        body = envelope(bash("echo up; sleep 30"))
        with client.stream(
            "POST", "/process.Process/Start", content=iter([body]), headers={"Content-Type": STREAM}
        ) as response:
            events = frames(response)
            pid = next(events)[1]["event"]["start"]["pid"]
            next(events)  # "up": the shell is running its script
            client.post("/process.Process/SendSignal", json={"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"})
            end = next(events)[1]["event"]["end"]
    assert end == {"exitCode": -1, "status": "signal: terminated", "error": "signal: terminated"}


def test_unknown_watcher_is_not_found(envd: Envd) -> None:
    with envd.client() as client:
        response = client.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": "wnope"})
    assert (response.status_code, response.json()["code"]) == (404, "not_found")


def test_unsupported_signal_is_invalid_argument(envd: Envd) -> None:
    with envd.client() as client:
        response = client.post("/process.Process/SendSignal", json={"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"})
    assert response.json()["code"] == "invalid_argument"


def test_tags_select_processes(envd: Envd) -> None:
    with envd.client() as client:
        body = envelope(bash("read line; echo $line", stdin=True, tag="my-tag"))
        with client.stream(
            "POST", "/process.Process/Start", content=iter([body]), headers={"Content-Type": STREAM}
        ) as response:
            events = frames(response)
            pid = next(events)[1]["event"]["start"]["pid"]
            listed = client.post("/process.Process/List", json={}).json()["processes"]
            assert {"pid": pid, "tag": "my-tag"}.items() <= next(p for p in listed if p["pid"] == pid).items()
            send = {"process": {"tag": "my-tag"}, "input": {"stdin": base64.b64encode(b"tagged\n").decode()}}
            assert client.post("/process.Process/SendInput", json=send).json() == {}
            assert next(events)[1] == {"event": {"data": {"stdout": base64.b64encode(b"tagged\n").decode()}}}
