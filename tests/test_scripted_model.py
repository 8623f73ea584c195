"""The scripted model server's wire, exactly as the agent CLIs read it: Anthropic Messages (Claude Code), OpenAI
Responses (Codex) and Chat Completions (OpenCode, Pi), streaming or not; its script; its other routes and its log.
The requests carry the tools and the injected content the real clients send (coding-agents.md §7.4, §8)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.scripted_model import DEFAULT_COMMAND, ScriptedModel

SCRIPT = Path(__file__).with_name("scripted_model.py")
HELLO = "hello from scripted model"
FINAL_TEXT = f"DONE. tool output: {HELLO}"

CLAUDE_BASH = {
    "name": "Bash",
    "description": "Executes a given bash command",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "number"},
            "description": {"type": "string"},
            "run_in_background": {"type": "boolean"},
            "dangerouslyDisableSandbox": {"type": "boolean"},
        },
        "required": ["command"],
    },
}
CLAUDE_READ = {"name": "Read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}
CODEX_EXEC_COMMAND = {
    "type": "function",
    "name": "exec_command",
    "parameters": {
        "type": "object",
        "properties": {
            "cmd": {"type": "string"},
            "justification": {"type": "string"},
            "login": {"type": "boolean"},
            "max_output_tokens": {"type": "number"},
            "prefix_rule": {"type": "array", "items": {"type": "string"}},
            "sandbox_permissions": {"type": "string"},
            "shell": {"type": "string"},
            "tty": {"type": "boolean"},
            "workdir": {"type": "string"},
            "yield_time_ms": {"type": "number"},
        },
        "required": ["cmd"],
    },
}
CODEX_WEB_SEARCH = {"type": "web_search"}
CODEX_CONTEXT = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/work</cwd>\n</environment_context>"}],
}
CODEX_OUTPUT = (  # how Codex hands a command's stdout back
    f"Chunk ID: 5f1c2a\nWall time: 0.0021 seconds\nProcess exited with code 0\nOriginal token count: 6\n"
    f"Output:\n{HELLO}\n"
)


def _chat_tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}


OPENCODE_BASH = _chat_tool(
    "bash", {"command": {"type": "string"}, "timeout": {"type": "number"}, "workdir": {"type": "string"}}, ["command"]
)
OPENCODE_READ = _chat_tool("read", {"filePath": {"type": "string"}}, ["filePath"])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedModel]:
    with ScriptedModel(log_path=tmp_path_factory.mktemp("scripted-model") / "requests.jsonl") as running:
        yield running


@pytest.fixture
def client(model: ScriptedModel) -> Iterator[httpx.Client]:
    headers = {"authorization": "Bearer sk-scripted-test", "x-api-key": "sk-ant-scripted-test", "cookie": "a=b"}
    with httpx.Client(base_url=model.url, headers=headers, timeout=10) as client:
        yield client


def _sse(response: httpx.Response) -> list[tuple[str | None, Any]]:
    """The frames of an SSE answer: (event name or None, data as JSON or, for `[DONE]`, text)."""
    frames: list[tuple[str | None, Any]] = []
    for frame in response.text.split("\n\n"):
        if not frame:
            continue
        fields = dict(line.split(": ", 1) for line in frame.split("\n"))
        assert set(fields) <= {"event", "data"}, frame
        data = fields["data"]
        frames.append((fields.get("event"), data if data == "[DONE]" else json.loads(data)))
    return frames


def _stream(client: httpx.Client, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["connection"] == "close"
    return _sse(response)


def _document(client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    response = client.post(path, json=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    return response.json()


def _names(frames: list[tuple[str | None, Any]]) -> list[str | None]:
    return [name for name, _ in frames]


def _datas(frames: list[tuple[str | None, Any]], name: str) -> list[Any]:
    return [data for event, data in frames if event == name]


# --- Anthropic Messages --------------------------------------------------------------------------------------------


def _claude_request(*messages: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "system": [],
        "tools": [CLAUDE_READ, CLAUDE_BASH],
        "messages": list(messages),
    }


CLAUDE_ASK = {
    "role": "user",
    "content": [
        {"type": "text", "text": "Write hello.txt"},
        {"type": "text", "text": "<system-reminder>\nThe date is today.\n</system-reminder>"},
    ],
}


def test_anthropic_stream_calls_bash_then_echoes_its_output(client: httpx.Client) -> None:
    frames = _stream(client, "/v1/messages?beta=true", _claude_request(CLAUDE_ASK))
    deltas = _datas(frames, "content_block_delta")
    assert _names(frames) == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * len(deltas),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in frames)
    (start,) = _datas(frames, "message_start")
    assert start["message"] | {"id": None} == {
        "id": None,
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 42,
            "output_tokens": 1,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert start["message"]["id"].startswith("msg_")
    (block_start,) = _datas(frames, "content_block_start")
    block = block_start["content_block"]
    assert block_start["index"] == 0
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "Bash", {})
    assert block["id"].startswith("toolu_")
    assert len(deltas) > 1
    assert all(delta["index"] == 0 and delta["delta"]["type"] == "input_json_delta" for delta in deltas)
    arguments = json.loads("".join(delta["delta"]["partial_json"] for delta in deltas))
    assert arguments == {"command": DEFAULT_COMMAND, "description": arguments["description"]}
    assert arguments["description"]
    assert _datas(frames, "content_block_stop") == [{"type": "content_block_stop", "index": 0}]
    assert _datas(frames, "message_delta") == [
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 7},
        }
    ]

    answer = {"role": "assistant", "content": [block | {"input": arguments}]}
    result = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": block["id"], "content": f"{HELLO}\n", "is_error": False},
            {"type": "text", "text": "<system-reminder>\nA file changed.\n</system-reminder>"},
        ],
    }
    frames = _stream(client, "/v1/messages?beta=true", _claude_request(CLAUDE_ASK, answer, result))
    assert _datas(frames, "content_block_start")[0]["content_block"] == {"type": "text", "text": ""}
    text_deltas = [data["delta"] for data in _datas(frames, "content_block_delta")]
    assert all(delta["type"] == "text_delta" for delta in text_deltas)
    assert "".join(delta["text"] for delta in text_deltas) == FINAL_TEXT
    assert _datas(frames, "message_delta")[0]["delta"]["stop_reason"] == "end_turn"
    assert _names(frames)[-1] == "message_stop"


def test_anthropic_document(client: httpx.Client) -> None:
    message = _document(client, "/v1/messages", _claude_request(CLAUDE_ASK))
    assert set(message) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert (message["type"], message["role"], message["stop_reason"]) == ("message", "assistant", "tool_use")
    (block,) = message["content"]
    assert (block["type"], block["name"], block["input"]["command"]) == ("tool_use", "Bash", DEFAULT_COMMAND)
    assert message["usage"]["output_tokens"] == 7

    text = _document(client, "/v1/messages", {"model": "claude-haiku", "messages": [CLAUDE_ASK]})
    assert (text["content"], text["stop_reason"]) == ([{"type": "text", "text": "Scripted reply."}], "end_turn")


def test_anthropic_count_tokens(client: httpx.Client) -> None:
    assert _document(client, "/v1/messages/count_tokens", _claude_request(CLAUDE_ASK)) == {"input_tokens": 42}


# --- OpenAI Responses ----------------------------------------------------------------------------------------------


def _codex_request(*items: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "model": "scripted",
        "instructions": "You are Codex.",
        "tool_choice": "auto",
        "store": False,
        "tools": [CODEX_WEB_SEARCH, CODEX_EXEC_COMMAND] if tools is None else tools,
        "input": [CODEX_CONTEXT, *items],
    }


def _codex_ask(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def _checked_responses(frames: list[tuple[str | None, Any]]) -> list[str | None]:
    """The events' names, having checked that each carries its type and the next sequence number."""
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
    assert all(data["type"] == name for name, data in frames)
    return _names(frames)


def test_responses_stream_calls_exec_command(client: httpx.Client) -> None:
    frames = _stream(client, "/v1/responses", _codex_request(_codex_ask("Write hello.txt")))
    assert _checked_responses(frames) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = frames[0][1]["response"]
    assert created | {"id": None, "created_at": None} == {
        "id": None,
        "object": "response",
        "created_at": None,
        "model": "scripted",
        "status": "in_progress",
        "output": [],
        "usage": None,
    }
    added = frames[2][1]
    item_id = added["item"]["id"]
    assert added["output_index"] == 0
    assert added["item"] == {
        "type": "function_call",
        "id": item_id,
        "call_id": added["item"]["call_id"],
        "name": "exec_command",
        "arguments": "",
        "status": "in_progress",
    }
    delta, done = frames[3][1], frames[4][1]
    assert json.loads(delta["delta"]) == {"cmd": DEFAULT_COMMAND}
    assert (delta["item_id"], done["item_id"], done["arguments"]) == (item_id, item_id, delta["delta"])
    item = frames[5][1]["item"]
    assert item == added["item"] | {"arguments": delta["delta"], "status": "completed"}
    completed = frames[6][1]["response"]
    assert (completed["id"], completed["status"], completed["output"]) == (created["id"], "completed", [item])
    assert completed["usage"] == {
        "input_tokens": 42,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 49,
    }


def test_responses_stream_echoes_codex_output(client: httpx.Client) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": CODEX_OUTPUT}
    frames = _stream(client, "/v1/responses", _codex_request(_codex_ask("Write hello.txt"), call, output))
    deltas = _datas(frames, "response.output_text.delta")
    assert _checked_responses(frames) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = frames[2][1]["item"]
    assert added | {"id": None} == {
        "type": "message",
        "id": None,
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    assert _datas(frames, "response.content_part.added")[0]["part"] == {
        "type": "output_text",
        "text": "",
        "annotations": [],
    }
    assert "".join(delta["delta"] for delta in deltas) == FINAL_TEXT
    assert all((d["item_id"], d["output_index"], d["content_index"]) == (added["id"], 0, 0) for d in deltas)
    assert _datas(frames, "response.output_text.done")[0]["text"] == FINAL_TEXT
    part = {"type": "output_text", "text": FINAL_TEXT, "annotations": []}
    assert _datas(frames, "response.content_part.done")[0]["part"] == part
    item = added | {"status": "completed", "content": [part]}
    assert _datas(frames, "response.output_item.done")[0]["item"] == item
    assert _datas(frames, "response.completed")[0]["response"]["output"] == [item]


def test_responses_escalate_asks_for_sandbox_permissions(client: httpx.Client) -> None:
    response = _document(client, "/v1/responses", _codex_request(_codex_ask("[[escalate]] Write hello.txt")))
    (item,) = response["output"]
    arguments = json.loads(item["arguments"])
    assert arguments == {
        "cmd": DEFAULT_COMMAND,
        "sandbox_permissions": "require_escalated",
        "justification": arguments["justification"],
    }
    assert arguments["justification"]


def test_responses_document(client: httpx.Client) -> None:
    response = _document(client, "/v1/responses", _codex_request(_codex_ask("Write hello.txt")))
    assert (response["object"], response["status"], response["usage"]["total_tokens"]) == ("response", "completed", 49)
    (item,) = response["output"]
    assert (item["type"], item["name"], item["status"]) == ("function_call", "exec_command", "completed")

    output = {"type": "function_call_output", "call_id": item["call_id"], "output": CODEX_OUTPUT}
    final = _document(client, "/v1/responses", _codex_request(_codex_ask("Write hello.txt"), item, output))
    (message,) = final["output"]
    assert message["content"] == [{"type": "output_text", "text": FINAL_TEXT, "annotations": []}]


def test_responses_local_shell(client: httpx.Client) -> None:
    frames = _stream(
        client, "/v1/responses", _codex_request(_codex_ask("Write hello.txt"), tools=[{"type": "local_shell"}])
    )
    assert _checked_responses(frames) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    item = frames[2][1]["item"]
    assert item | {"id": None, "call_id": None} == {
        "type": "local_shell_call",
        "id": None,
        "call_id": None,
        "status": "completed",
        "action": {"type": "exec", "command": ["bash", "-lc", DEFAULT_COMMAND]},
    }
    assert frames[3][1]["item"] == item


# --- OpenAI Chat Completions ---------------------------------------------------------------------------------------


def _chat_request(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    system = {"role": "system", "content": "You are opencode."}
    tools = [OPENCODE_READ, OPENCODE_BASH] if tools is None else tools
    return {"model": "scripted", "max_tokens": 32000, "messages": [system, *messages], "tools": tools}


CHAT_ASK = {"role": "user", "content": [{"type": "text", "text": "Write hello.txt"}]}


def _chunk_parts(frames: list[tuple[str | None, Any]]) -> list[tuple[Any, Any]]:
    """(delta, finish_reason) of each chunk, having checked the frames are data-only, the chunks alike, and the
    stream ends with `[DONE]`."""
    assert _names(frames) == [None] * len(frames)
    assert frames[-1][1] == "[DONE]"
    chunks = [data for _, data in frames[:-1]]
    assert {(c["id"], c["object"], c["created"], c["model"]) for c in chunks} == {
        (chunks[0]["id"], "chat.completion.chunk", chunks[0]["created"], "scripted")
    }
    assert all(len(chunk["choices"]) == 1 and chunk["choices"][0]["index"] == 0 for chunk in chunks)
    return [(chunk["choices"][0]["delta"], chunk["choices"][0]["finish_reason"]) for chunk in chunks]


def test_chat_stream_calls_bash_then_echoes_its_output(client: httpx.Client) -> None:
    frames = _stream(client, "/v1/chat/completions", _chat_request(CHAT_ASK))
    (first, _), (second, _), last = parts = _chunk_parts(frames)
    (call,) = first["tool_calls"]
    assert first == {"role": "assistant", "content": None, "tool_calls": [call]}
    assert call | {"id": None} == {
        "index": 0,
        "id": None,
        "type": "function",
        "function": {"name": "bash", "arguments": ""},
    }
    assert call["id"].startswith("call_")
    (more,) = second["tool_calls"]
    assert more == {"index": 0, "function": {"arguments": more["function"]["arguments"]}}
    assert json.loads(more["function"]["arguments"]) == {"command": DEFAULT_COMMAND}
    assert [finish for _, finish in parts] == [None, None, "tool_calls"]
    assert last == ({}, "tool_calls")

    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call["id"], "type": "function", "function": more["function"]}],
    }
    result = {"role": "tool", "tool_call_id": call["id"], "content": f"{HELLO}\n"}
    request = _chat_request(CHAT_ASK, assistant, result) | {"stream_options": {"include_usage": True}}
    frames = _stream(client, "/v1/chat/completions", request)
    *text_frames, usage, done = frames
    assert usage[1]["choices"] == []
    assert usage[1]["usage"] == {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}
    parts = _chunk_parts([*text_frames, done])
    assert parts[0] == ({"role": "assistant", "content": ""}, None)
    assert parts[-1] == ({}, "stop")
    assert all(set(delta) == {"content"} and finish is None for delta, finish in parts[1:-1])
    assert "".join(delta["content"] for delta, _ in parts[1:-1]) == FINAL_TEXT


def test_chat_document(client: httpx.Client) -> None:
    completion = _document(client, "/v1/chat/completions", _chat_request(CHAT_ASK))
    assert completion["object"] == "chat.completion"
    assert completion["usage"] == {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}
    (choice,) = completion["choices"]
    assert (choice["index"], choice["finish_reason"], choice["message"]["content"]) == (0, "tool_calls", None)
    (call,) = choice["message"]["tool_calls"]
    assert (call["type"], call["function"]["name"]) == ("function", "bash")
    assert json.loads(call["function"]["arguments"]) == {"command": DEFAULT_COMMAND}


def test_chat_without_tools_answers_a_short_text(client: httpx.Client) -> None:
    title = {"model": "scripted", "messages": [{"role": "user", "content": "Generate a title"}], "stream": True}
    parts = _chunk_parts(_stream(client, "/v1/chat/completions", title))
    assert "".join(delta.get("content", "") for delta, _ in parts) == "Scripted reply."


def test_notool_echoes_the_user_text(client: httpx.Client) -> None:
    ask = {"role": "user", "content": "[[notool]] say hi"}
    completion = _document(client, "/v1/chat/completions", _chat_request(ask))
    assert completion["choices"][0]["message"] == {"role": "assistant", "content": "OK: [[notool]] say hi"}
    assert completion["choices"][0]["finish_reason"] == "stop"


def test_tool_is_picked_by_name_and_its_arguments_follow_its_schema(client: httpx.Client) -> None:
    run = _chat_tool(
        "run_shell_command",
        {
            "script": {"type": "array", "items": {"type": "string"}},
            "force": {"type": "boolean"},
            "retries": {"type": ["integer", "null"]},
            "note": {"type": "string"},
            "cwd": {"type": "string"},
        },
        ["script", "force", "retries", "note"],
    )
    shell = _chat_tool("shell", {"commandLine": {"type": "string"}}, ["commandLine"])
    completion = _document(client, "/v1/chat/completions", _chat_request(CHAT_ASK, tools=[OPENCODE_READ, run, shell]))
    (call,) = completion["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "shell",
        {"commandLine": DEFAULT_COMMAND},
    )

    completion = _document(client, "/v1/chat/completions", _chat_request(CHAT_ASK, tools=[OPENCODE_READ, run]))
    (call,) = completion["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {
        "script": ["bash", "-lc", DEFAULT_COMMAND],
        "force": False,
        "retries": 10000,
        "note": "",
    }


def test_offered_tools_without_a_shell_are_not_called(client: httpx.Client) -> None:
    completion = _document(client, "/v1/chat/completions", _chat_request(CHAT_ASK, tools=[OPENCODE_READ]))
    assert completion["choices"][0]["message"]["content"] == "OK: Write hello.txt"


# --- Other routes, request bodies, the log -------------------------------------------------------------------------


def test_models(client: httpx.Client) -> None:
    models = client.get("/v1/models").json()
    assert [model["id"] for model in models["data"]] == ["scripted", "claude-sonnet-4-5", "gpt-5"]
    assert models["data"][0] == {
        "id": "scripted",
        "object": "model",
        "type": "model",
        "display_name": "scripted",
        "created": 0,
        "owned_by": "scripted",
        "created_at": "2025-01-01T00:00:00Z",
    }
    assert (models["object"], models["has_more"], models["first_id"], models["last_id"]) == (
        "list",
        False,
        "scripted",
        "gpt-5",
    )


def test_head_unknown_routes_and_bodies_that_are_not_json_objects(client: httpx.Client) -> None:
    head = client.head("/anything")
    assert (head.status_code, head.content) == (200, b"")
    for method, path in [("GET", "/v1/nothing"), ("GET", "/v1/messages"), ("DELETE", "/v1/models")]:
        response = client.request(method, path)
        assert response.status_code == 404
        assert response.json() == {"error": {"message": f"no route {path}"}}
    for body in [b"not json", b"[]"]:
        response = client.post("/v1/chat/completions", content=body)
        assert response.status_code == 400
        assert response.json() == {"error": {"message": "the body is not a JSON object"}}


def test_chunked_request_body(client: httpx.Client) -> None:
    body = json.dumps(_chat_request(CHAT_ASK)).encode()
    pieces = iter([body[:10], body[10:100], body[100:]])
    response = client.post("/v1/chat/completions", content=pieces, headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_log_has_each_request_without_secrets(client: httpx.Client, model: ScriptedModel) -> None:
    client.post("/v1/chat/completions", json=_chat_request(CHAT_ASK))
    entry = model.requests[-1]
    assert (entry["method"], entry["path"], entry["status"]) == ("POST", "/v1/chat/completions", 200)
    assert entry["body"] == _chat_request(CHAT_ASK)
    assert entry["answer"] == {"tool_call": {"name": "bash", "arguments": {"command": DEFAULT_COMMAND}}}
    assert entry["headers"]["host"] == f"127.0.0.1:{model.port}"
    assert not {"authorization", "x-api-key", "cookie"} & set(entry["headers"])
    assert model.log_path is not None
    logged = [json.loads(line) for line in model.log_path.read_text().splitlines()]
    assert logged == model.requests
    assert "sk-" not in model.log_path.read_text()


def test_command_line_server(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    argv = [sys.executable, str(SCRIPT), "--port", "0", "--log", str(log), "--command", "echo hi"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            word, address = server.stdout.readline().split()
            assert word == "listening"
            assert address.startswith("127.0.0.1:")
            completion = httpx.post(f"http://{address}/v1/chat/completions", json=_chat_request(CHAT_ASK)).json()
            arguments = completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
            assert json.loads(arguments) == {"command": "echo hi"}
        finally:
            server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0
    assert json.loads(log.read_text())["path"] == "/v1/chat/completions"
