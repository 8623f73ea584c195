"""Port 49999's wire contract (e2b-protocol.md §4), read off the raw HTTP exchange through the gateway.

The SDK forgives a lot (it skips unknown lines and ignores status bodies); these tests pin what it
does not check: the order and shape of the NDJSON lines, keepalives, and the plain-text errors.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server_fixtures import RunningServer
from tests.test_code_interpreter_sdk import interpreter_sandbox


@pytest.fixture(scope="module")
def interpreter(server: RunningServer) -> Iterator[httpx.Client]:
    """An HTTP client whose requests reach port 49999 of one code-interpreter sandbox."""
    with interpreter_sandbox(server) as sandbox:
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"}
        headers["X-Access-Token"] = sandbox._envd_access_token or ""  # what the SDK sends (a secure sandbox's)
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
            yield client


def execute(client: httpx.Client, code: str, **fields: Any) -> tuple[httpx.Response, list[str]]:
    body = {"code": code, "context_id": None, "language": None, "env_vars": None, **fields}
    with client.stream("POST", "/execute", json=body) as response:
        raw = response.read().decode()
    return response, raw.split("\n")


def test_execute_streams_ndjson_in_the_reference_order(interpreter: httpx.Client) -> None:
    response, lines = execute(interpreter, "print('hi')\n'abc'")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert lines[-1] == ""  # every line ends with a newline, and no line is blank
    messages = [json.loads(line) for line in lines[:-1]]
    assert [m["type"] for m in messages] == ["number_of_executions", "stdout", "result", "end_of_execution"]
    assert messages[1]["text"] == "hi\n"
    assert messages[1]["timestamp"].endswith("+00:00")
    assert messages[2] == {"type": "result", "is_main_result": True, "text": "abc"}


def test_an_error_line_has_name_value_and_traceback(interpreter: httpx.Client) -> None:
    _, lines = execute(interpreter, "raise ValueError('nope')")
    errors = [json.loads(line) for line in lines if '"type":"error"' in line]
    assert len(errors) == 1
    assert errors[0]["name"] == "ValueError"
    assert errors[0]["value"] == "nope"
    assert "ValueError" in errors[0]["traceback"]


def test_a_quiet_execution_sends_keepalives(interpreter: httpx.Client) -> None:
    _, lines = execute(interpreter, "import time; time.sleep(6)")
    assert '{"type":"keepalive"}' in lines
    assert json.loads(lines[-2]) == {"type": "end_of_execution"}


def test_context_id_and_language_together_are_rejected(interpreter: httpx.Client) -> None:
    response, lines = execute(interpreter, "1", context_id="x", language="python")
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("text/plain")
    assert lines == ["Only one of context_id or language can be provided"]


def test_an_unknown_context_is_404_in_the_reference_words(interpreter: httpx.Client) -> None:
    response, lines = execute(interpreter, "1", context_id="missing")
    assert response.status_code == 404
    assert lines == ["Context missing not found"]
    assert interpreter.post("/contexts/missing/restart").status_code == 404
    assert interpreter.delete("/contexts/missing").status_code == 404


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"language": "cobol"}, 400),
        ({"language": "python", "cwd": "/no/such/dir"}, 400),
        ({"language": "JS"}, 200),
    ],
)
def test_create_context_validates_language_and_cwd(
    interpreter: httpx.Client, body: dict[str, str], status: int
) -> None:
    response = interpreter.post("/contexts", json=body)
    assert response.status_code == status, response.text
    if status == 200:
        assert response.json()["language"] == "javascript"
        assert interpreter.delete(f"/contexts/{response.json()['id']}").status_code == 204


def test_default_contexts_are_listed_and_health_answers(interpreter: httpx.Client) -> None:
    execute(interpreter, "1")
    contexts = interpreter.get("/contexts").json()
    assert {"python"} <= {context["language"] for context in contexts}
    assert all(set(context) == {"id", "language", "cwd"} for context in contexts)
    assert interpreter.get("/health").json() == "OK"


def test_a_malformed_body_is_a_400(interpreter: httpx.Client) -> None:
    response = interpreter.post("/execute", content=b"{not json")
    assert response.status_code == 400
    bad_name = execute(interpreter, "1", env_vars={"NOT-A-NAME": "x"})[0]
    assert bad_name.status_code == 400
