"""The interpreter's pure pieces: MIME bundles to result lines, IOPub messages to lines, env var code."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from typing import Any

import pytest

from executor.interpreter._envcode import restore_env_code, set_env_code, valid_env_name
from executor.interpreter._iopub import is_idle, line_from_message
from executor.interpreter._wire import (
    EndOfExecution,
    Error,
    Keepalive,
    NumberOfExecutions,
    Result,
    Stderr,
    Stdout,
    encode_line,
    result_from_bundle,
)


def test_every_mime_type_lands_in_its_field_and_the_rest_in_extra() -> None:
    bundle = {
        "text/plain": "t",
        "text/html": "<b>",
        "text/markdown": "**",
        "image/svg+xml": "<svg/>",
        "image/png": "iVBO",
        "image/jpeg": "/9j/",
        "application/pdf": "JVBE",
        "text/latex": "$x$",
        "application/json": {"a": 1},
        "application/javascript": "alert()",
        "e2b/data": {"d": 1},
        "e2b/chart": {"type": "line"},
        "application/vnd.custom": "c",
    }
    line = json.loads(encode_line(result_from_bundle(bundle, is_main_result=False)))
    assert line == {
        "type": "result",
        "is_main_result": False,
        "text": "t",
        "html": "<b>",
        "markdown": "**",
        "svg": "<svg/>",
        "png": "iVBO",
        "jpeg": "/9j/",
        "pdf": "JVBE",
        "latex": "$x$",
        "json": {"a": 1},
        "javascript": "alert()",
        "data": {"d": 1},
        "chart": {"type": "line"},
        "extra": {"application/vnd.custom": "c"},
    }


@pytest.mark.parametrize(("plain", "text"), [("'abc'", "abc"), ('"abc"', '"abc"'), ("'", "'"), ("2", "2")])
def test_one_pair_of_single_quotes_is_stripped_from_text(plain: str, text: str) -> None:
    assert result_from_bundle({"text/plain": plain}, is_main_result=True).text == text


@pytest.mark.parametrize(
    ("line", "encoded"),
    [
        (NumberOfExecutions(execution_count=3), b'{"type":"number_of_executions","execution_count":3}\n'),
        (Stdout(text="a", timestamp="t"), b'{"type":"stdout","text":"a","timestamp":"t"}\n'),
        (Stderr(text="b", timestamp="t"), b'{"type":"stderr","text":"b","timestamp":"t"}\n'),
        (Result(is_main_result=True, text="2"), b'{"type":"result","is_main_result":true,"text":"2"}\n'),
        (Error(name="E", value="v", traceback="tb"), b'{"type":"error","name":"E","value":"v","traceback":"tb"}\n'),
        (Keepalive(), b'{"type":"keepalive"}\n'),
        (EndOfExecution(), b'{"type":"end_of_execution"}\n'),
    ],
)
def test_lines_encode_as_the_reference_sends_them(line: Any, encoded: bytes) -> None:
    assert encode_line(line) == encoded


def message(kind: str, content: dict[str, Any], date: datetime | None = None) -> dict[str, Any]:
    return {"msg_type": kind, "content": content, "header": {"date": date or datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)}}


def test_iopub_messages_map_to_lines() -> None:
    assert line_from_message(message("execute_input", {"execution_count": 7})) == NumberOfExecutions(execution_count=7)
    assert line_from_message(message("stream", {"name": "stderr", "text": "x"})) == Stderr(
        text="x", timestamp="2025-01-02T03:04:05+00:00"
    )
    main = line_from_message(message("execute_result", {"data": {"text/plain": "1"}}))
    assert main == Result(is_main_result=True, text="1")
    display = line_from_message(message("display_data", {"data": {"image/png": "p"}}))
    assert display == Result(is_main_result=False, png="p")
    assert line_from_message(message("status", {"execution_state": "busy"})) is None
    assert is_idle(message("status", {"execution_state": "idle"}))


def test_an_error_joins_the_traceback_and_names_nameless_errors() -> None:
    error = message("error", {"ename": "KeyError", "evalue": "'k'", "traceback": ["a", "b"]})
    assert line_from_message(error) == Error(name="KeyError", value="'k'", traceback="a\nb")
    bash_error = message("error", {"ename": "", "evalue": "1", "traceback": []})  # bash_kernel's non-zero exit
    assert line_from_message(bash_error) == Error(name="Error", value="1", traceback="Error: 1")


@pytest.mark.parametrize(("name", "valid"), [("PATH", True), ("_x1", True), ("1X", False), ("A-B", False)])
def test_env_var_names_are_shell_identifiers(name: str, valid: bool) -> None:
    assert valid_env_name(name) is valid


def test_python_env_code_sets_then_restores_the_previous_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_KEPT", "before")
    monkeypatch.delenv("E2B_NEW", raising=False)
    env = {"E2B_KEPT": "during", "E2B_NEW": 'it\'s "quoted"'}
    namespace: dict[str, Any] = {}
    exec(set_env_code("python", env), namespace)
    assert (os.environ["E2B_KEPT"], os.environ["E2B_NEW"]) == ("during", 'it\'s "quoted"')
    exec(restore_env_code("python", env), namespace)
    assert os.environ["E2B_KEPT"] == "before"
    assert "E2B_NEW" not in os.environ
    assert not [name for name in namespace if name.startswith("__e2b")]


def test_bash_env_code_sets_then_restores_the_previous_values() -> None:
    env = {"KEPT": "during", "NEW": "it's $(not run)"}
    script = "\n".join(
        [
            "KEPT=before; export KEPT",
            set_env_code("bash", env),
            'echo "$KEPT|$NEW"',
            restore_env_code("bash", env),
            'echo "$KEPT|${NEW-unset}"',
        ]
    )
    output = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert output == "during|it's $(not run)\nbefore|unset\n"
