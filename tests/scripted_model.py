"""A deterministic scripted model server, so real agent CLIs (Claude Code, Codex, OpenCode, Pi) complete a turn offline.

It speaks the three wire protocols those CLIs use on one HTTP/1.1 port: Anthropic Messages (`POST /v1/messages`),
OpenAI Responses (`POST /v1/responses`) and OpenAI Chat Completions (`POST /v1/chat/completions`), streaming or
not, plus `GET /v1/models`, `POST /v1/messages/count_tokens` and `HEAD` on any path. Its script, applied to the
conversation each request carries: while the last user text has no tool result after it, call the shell tool
offered with a command; after the tool's result, answer `DONE. tool output: <the output>`. It follows §8 of the
coding-agents reference (coding-agents.md, "A scripted model server: what it must speak"). Every request is logged
(secret headers left out), in memory and, with `--log`, as JSONL.

Standard library only, so it also runs under Debian 12's python3 (3.11.2) and inside a sandbox:

    python3 tests/scripted_model.py --host 127.0.0.1 --port 0 --log requests.jsonl [--command "..."]

prints `listening <host>:<port>` once bound and serves until SIGTERM or SIGINT. In tests: `ScriptedModel()` with
`start()` (returns the port) and `stop()`, or as a context manager.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

__all__ = ["DEFAULT_COMMAND", "ScriptedModel", "main"]

JSON = dict[str, Any]

DEFAULT_COMMAND = "printf 'hello from scripted model\\n' > hello.txt && cat hello.txt"
EVENT_DELAY = 0.005  # seconds between two events of a stream
STOP_POLL_INTERVAL = 0.05  # seconds; how soon `stop()` returns
INPUT_TOKENS, OUTPUT_TOKENS = 42, 7  # the usage every answer reports
MODEL_IDS = ("scripted", "claude-sonnet-4-5", "gpt-5")
NO_TOOL, ESCALATE = "[[notool]]", "[[escalate]]"  # markers a test puts in the user text
NO_TOOLS_REPLY = "Scripted reply."
ESCALATION_JUSTIFICATION = "The scripted model asks to run its test command outside the sandbox."
COMMAND_DESCRIPTION = "Run the scripted test command"
TOOL_OUTPUT_CHARS = 80  # how much of a tool's output the final text echoes
ARGUMENT_PIECE_CHARS = 40  # the size of each Anthropic `input_json_delta`
WORDS_PER_DELTA = 3
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "cookie"})

# The shell tools, by preference; failing them, a Responses `local_shell` tool.
SHELL_TOOL_NAMES = (
    "Bash", "bash", "exec_command", "shell_command", "shell", "run_shell_command", "execute_command", "terminal",
    "run_terminal_cmd",
)  # fmt: skip
COMMAND_PROPERTIES = ("command", "cmd", "commandLine", "script")
# User content the clients inject, which is not what the user said: Claude Code's reminders, Codex's context.
INJECTED_PREFIXES = ("<system-reminder>", "<environment_context>", "<user_instructions>", "# AGENTS.md", "<permissions")
TEXT_PART_TYPES = frozenset({"text", "input_text"})
TOOL_OUTPUT_ITEM_TYPES = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})


# --- The script -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tool:
    """A tool the client offers: its name and its arguments' JSON schema, or a Responses `local_shell` tool."""

    name: str
    schema: JSON
    local_shell: bool = False


@dataclass(frozen=True)
class _ToolCall:
    name: str
    arguments: JSON
    command: str
    local_shell: bool


@dataclass(frozen=True)
class _Text:
    text: str


_Reply = _ToolCall | _Text
_Said = tuple[Literal["user", "tool"], str]  # a user text, or a tool's result, in the conversation's order


def _reply(said: Iterator[_Said], tools: list[_Tool], tools_offered: bool, command: str) -> _Reply:
    user_text, tool_result = _last_exchange(said)
    tool = _shell_tool(tools)
    if tool and tool_result is None and NO_TOOL not in user_text:
        return _call(tool, command, escalate=ESCALATE in user_text)
    if tool_result is not None:
        return _Text(f"DONE. tool output: {_tool_output(tool_result)}")
    return _Text(f"OK: {user_text.strip()}" if tools_offered else NO_TOOLS_REPLY)


def _last_exchange(said: Iterator[_Said]) -> tuple[str, str | None]:
    """The last user text, and the last tool result after it (None if none arrived since)."""
    user_text, tool_result = "", None
    for kind, text in said:
        if kind == "tool":
            tool_result = text
        elif not text.lstrip().startswith(INJECTED_PREFIXES):
            user_text, tool_result = text, None
    return user_text, tool_result


def _shell_tool(tools: list[_Tool]) -> _Tool | None:
    by_name = {tool.name: tool for tool in tools if not tool.local_shell}
    for name in SHELL_TOOL_NAMES:
        if name in by_name:
            return by_name[name]
    return next((tool for tool in tools if tool.local_shell), None)


def _call(tool: _Tool, command: str, *, escalate: bool) -> _ToolCall:
    arguments = {} if tool.local_shell else _arguments(tool.schema, command)
    if escalate and tool.name == "exec_command":  # makes Codex ask for approval
        arguments |= {"sandbox_permissions": "require_escalated", "justification": ESCALATION_JUSTIFICATION}
    return _ToolCall(tool.name, arguments, command, tool.local_shell)


def _arguments(schema: JSON, command: str) -> JSON:
    """Arguments that fit the tool's schema: the command, a description, and a placeholder for each other required
    property; optional ones (`workdir`, `timeout`...) are left out."""
    properties = _object(schema.get("properties"))
    required = _list(schema.get("required"))
    command_property = next((name for name in COMMAND_PROPERTIES if name in properties), COMMAND_PROPERTIES[0])
    arguments: JSON = {} if command_property in properties else {command_property: command}
    for name, spec in properties.items():
        if name == command_property:
            arguments[name] = ["bash", "-lc", command] if _schema_type(spec) == "array" else command
        elif name == "description":
            arguments[name] = COMMAND_DESCRIPTION
        elif name in required:
            arguments[name] = _placeholder(spec)
    return arguments


def _schema_type(spec: Any) -> str:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(kind, list):  # e.g. ["integer", "null"]
        kind = next((one for one in kind if one != "null"), None)
    return kind if isinstance(kind, str) else ""


def _placeholder(spec: Any) -> Any:
    match _schema_type(spec):
        case "boolean":
            return False
        case "integer" | "number":
            return 10000
        case "array":
            return []
        case "object":
            return {}
        case _:
            return ""


def _tool_output(result: str) -> str:
    """What the final text echoes of a tool's result: Codex's stdout without its header, whitespace collapsed."""
    header, marker, stdout = result.partition("Output:")
    if marker and "Wall time" in header:  # Codex: "Chunk ID: …\nWall time: …\n…Output:\n<stdout>"
        result = stdout
    return " ".join(result.split())[:TOOL_OUTPUT_CHARS]


# --- Reading requests -------------------------------------------------------------------------------------------


def _object(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[JSON]:
    return [item for item in _list(value) if isinstance(item, dict)]


def _text(content: Any) -> str:
    """The text of a tool result or message content: a string, or the texts of a list of parts, one per line."""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return _text(content.get("text"))
    if isinstance(content, list):
        return "\n".join(text for part in content if (text := _text(part)))
    return ""


def _said_in(content: Any) -> Iterator[_Said]:
    """What one message's content says: a string, or text parts and (Anthropic) `tool_result` blocks."""
    if isinstance(content, str):
        yield "user", content
    for part in _dicts(content):
        if part.get("type") in TEXT_PART_TYPES:
            yield "user", _text(part.get("text"))
        elif part.get("type") == "tool_result":
            yield "tool", _text(part.get("content"))


def _anthropic_said(request: JSON) -> Iterator[_Said]:
    for message in _dicts(request.get("messages")):
        if message.get("role") == "user":
            yield from _said_in(message.get("content"))


def _responses_said(request: JSON) -> Iterator[_Said]:
    items = request.get("input")
    if isinstance(items, str):
        yield "user", items
    for item in _dicts(items):
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "user":
            yield from _said_in(item.get("content"))
        elif kind in TOOL_OUTPUT_ITEM_TYPES:
            yield "tool", _text(item.get("output"))


def _chat_said(request: JSON) -> Iterator[_Said]:
    for message in _dicts(request.get("messages")):
        if message.get("role") == "user":
            yield from _said_in(message.get("content"))
        elif message.get("role") == "tool":
            yield "tool", _text(message.get("content"))


def _anthropic_tools(request: JSON) -> list[_Tool]:
    tools = _dicts(request.get("tools"))
    return [
        _Tool(tool["name"], _object(tool.get("input_schema"))) for tool in tools if isinstance(tool.get("name"), str)
    ]


def _responses_tools(request: JSON) -> list[_Tool]:
    tools: list[_Tool] = []
    for tool in _dicts(request.get("tools")):
        if tool.get("type") == "function" and isinstance(tool.get("name"), str):
            tools.append(_Tool(tool["name"], _object(tool.get("parameters"))))
        elif tool.get("type") == "local_shell":
            tools.append(_Tool("local_shell", {}, local_shell=True))
    return tools


def _chat_tools(request: JSON) -> list[_Tool]:
    functions = [
        _object(tool.get("function")) for tool in _dicts(request.get("tools")) if tool.get("type") == "function"
    ]
    return [_Tool(f["name"], _object(f.get("parameters"))) for f in functions if isinstance(f.get("name"), str)]


# --- Writing answers --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Turn:
    """One answer to write: the request, the script's reply, and what makes its ids and timestamps."""

    request: JSON
    reply: _Reply
    serial: int
    created: int

    @property
    def model(self) -> str:
        model = self.request.get("model")
        return model if isinstance(model, str) else MODEL_IDS[0]

    def id(self, prefix: str) -> str:
        return f"{prefix}scripted{self.serial:04d}"


_Event = tuple[str, JSON]


def _named_frame(name: str, data: JSON) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def _data_frame(data: JSON | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def _pieces(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)]


def _word_pieces(text: str) -> list[str]:
    return re.findall(rf"(?:\S+\s*){{1,{WORDS_PER_DELTA}}}", text)


def _arguments_json(call: _ToolCall) -> str:
    return json.dumps(call.arguments)


# Anthropic Messages (§8.3)

_ANTHROPIC_USAGE = {"input_tokens": INPUT_TOKENS, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def _anthropic_block(turn: _Turn) -> JSON:
    if isinstance(turn.reply, _ToolCall):
        return {"type": "tool_use", "id": turn.id("toolu_"), "name": turn.reply.name, "input": turn.reply.arguments}
    return {"type": "text", "text": turn.reply.text}


def _anthropic_message(turn: _Turn, content: list[JSON], stop_reason: str | None, output_tokens: int) -> JSON:
    return {
        "id": turn.id("msg_"), "type": "message", "role": "assistant", "model": turn.model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {**_ANTHROPIC_USAGE, "output_tokens": output_tokens},
    }  # fmt: skip


def _anthropic_stop_reason(turn: _Turn) -> str:
    return "tool_use" if isinstance(turn.reply, _ToolCall) else "end_turn"


def _anthropic_document(turn: _Turn) -> JSON:
    return _anthropic_message(turn, [_anthropic_block(turn)], _anthropic_stop_reason(turn), OUTPUT_TOKENS)


def _anthropic_stream(turn: _Turn) -> list[str]:
    block = _anthropic_block(turn)
    if isinstance(turn.reply, _ToolCall):
        start = {**block, "input": {}}
        pieces = _pieces(_arguments_json(turn.reply), ARGUMENT_PIECE_CHARS)
        deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in pieces]
    else:
        start = {**block, "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in _word_pieces(turn.reply.text)]
    events: list[_Event] = [
        ("message_start", {"message": _anthropic_message(turn, [], None, 1)}),
        ("content_block_start", {"index": 0, "content_block": start}),
        *(("content_block_delta", {"index": 0, "delta": delta}) for delta in deltas),
        ("content_block_stop", {"index": 0}),
        ("message_delta", {
            "delta": {"stop_reason": _anthropic_stop_reason(turn), "stop_sequence": None},
            "usage": {"output_tokens": OUTPUT_TOKENS},
        }),
        ("message_stop", {}),
    ]  # fmt: skip
    return [_named_frame(name, {"type": name, **data}) for name, data in events]


# OpenAI Responses (§8.4)

_RESPONSES_USAGE = {
    "input_tokens": INPUT_TOKENS, "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": OUTPUT_TOKENS, "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
}  # fmt: skip


def _response(turn: _Turn, output: list[JSON] | None = None) -> JSON:
    """The response object: in progress (no output yet), or completed with its output and usage."""
    completed = output is not None
    return {
        "id": turn.id("resp_"), "object": "response", "created_at": turn.created, "model": turn.model,
        "status": "completed" if completed else "in_progress", "output": output or [],
        "usage": _RESPONSES_USAGE if completed else None,
    }  # fmt: skip


_OUTPUT = {"output_index": 0}  # the one output item's place, in its events


def _responses_item(turn: _Turn) -> tuple[list[_Event], JSON]:
    """The events that stream the one output item (but its `response.output_item.done`), and the item completed."""
    reply = turn.reply
    if isinstance(reply, _Text):
        return _message_item(turn, reply)
    return _local_shell_item(turn, reply) if reply.local_shell else _function_call_item(turn, reply)


def _local_shell_item(turn: _Turn, call: _ToolCall) -> tuple[list[_Event], JSON]:
    item: JSON = {
        "type": "local_shell_call", "id": turn.id("lsh_"), "call_id": turn.id("call_"), "status": "completed",
        "action": {"type": "exec", "command": ["bash", "-lc", call.command]},
    }  # fmt: skip
    return [("response.output_item.added", {**_OUTPUT, "item": item})], item


def _function_call_item(turn: _Turn, call: _ToolCall) -> tuple[list[_Event], JSON]:
    arguments, item_id = _arguments_json(call), turn.id("fc_")
    item: JSON = {
        "type": "function_call", "id": item_id, "call_id": turn.id("call_"), "name": call.name,
        "arguments": arguments, "status": "completed",
    }  # fmt: skip
    return [
        ("response.output_item.added", {**_OUTPUT, "item": {**item, "arguments": "", "status": "in_progress"}}),
        ("response.function_call_arguments.delta", {**_OUTPUT, "item_id": item_id, "delta": arguments}),
        ("response.function_call_arguments.done", {**_OUTPUT, "item_id": item_id, "arguments": arguments}),
    ], item


def _message_item(turn: _Turn, reply: _Text) -> tuple[list[_Event], JSON]:
    item_id = turn.id("msg_")
    part: JSON = {"type": "output_text", "text": reply.text, "annotations": []}
    item: JSON = {"type": "message", "id": item_id, "role": "assistant", "status": "completed", "content": [part]}
    in_part = {**_OUTPUT, "item_id": item_id, "content_index": 0}
    return [
        ("response.output_item.added", {**_OUTPUT, "item": {**item, "status": "in_progress", "content": []}}),
        ("response.content_part.added", {**in_part, "part": {**part, "text": ""}}),
        *(("response.output_text.delta", {**in_part, "delta": piece}) for piece in _word_pieces(reply.text)),
        ("response.output_text.done", {**in_part, "text": reply.text}),
        ("response.content_part.done", {**in_part, "part": part}),
    ], item


def _responses_document(turn: _Turn) -> JSON:
    return _response(turn, [_responses_item(turn)[1]])


def _responses_stream(turn: _Turn) -> list[str]:
    item_events, item = _responses_item(turn)
    events: list[_Event] = [
        ("response.created", {"response": _response(turn)}),
        ("response.in_progress", {"response": _response(turn)}),
        *item_events,
        ("response.output_item.done", {**_OUTPUT, "item": item}),
        ("response.completed", {"response": _response(turn, [item])}),
    ]
    return [
        _named_frame(name, {"type": name, "sequence_number": number, **data})
        for number, (name, data) in enumerate(events)
    ]


# OpenAI Chat Completions (§8.5)

_CHAT_USAGE = {
    "prompt_tokens": INPUT_TOKENS,
    "completion_tokens": OUTPUT_TOKENS,
    "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS,
}


def _chat_finish_reason(turn: _Turn) -> str:
    return "tool_calls" if isinstance(turn.reply, _ToolCall) else "stop"


def _chat_head(turn: _Turn, kind: str) -> JSON:
    return {"id": turn.id("chatcmpl-"), "object": kind, "created": turn.created, "model": turn.model}


def _chat_document(turn: _Turn) -> JSON:
    reply = turn.reply
    message: JSON = {"role": "assistant", "content": reply.text if isinstance(reply, _Text) else None}
    if isinstance(reply, _ToolCall):
        function = {"name": reply.name, "arguments": _arguments_json(reply)}
        message["tool_calls"] = [{"id": turn.id("call_"), "type": "function", "function": function}]
    choice = {"index": 0, "message": message, "finish_reason": _chat_finish_reason(turn)}
    return {**_chat_head(turn, "chat.completion"), "choices": [choice], "usage": _CHAT_USAGE}


def _chat_deltas(turn: _Turn) -> list[JSON]:
    reply = turn.reply
    if isinstance(reply, _Text):
        return [{"role": "assistant", "content": ""}, *({"content": piece} for piece in _word_pieces(reply.text))]
    function = {"name": reply.name, "arguments": ""}
    call = {"index": 0, "id": turn.id("call_"), "type": "function", "function": function}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"tool_calls": [{"index": 0, "function": {"arguments": _arguments_json(reply)}}]},
    ]


def _chat_stream(turn: _Turn) -> list[str]:
    head = _chat_head(turn, "chat.completion.chunk")
    choices: list[JSON] = [{"index": 0, "delta": delta, "finish_reason": None} for delta in _chat_deltas(turn)]
    choices.append({"index": 0, "delta": {}, "finish_reason": _chat_finish_reason(turn)})
    chunks = [{**head, "choices": [choice]} for choice in choices]
    stream_options = turn.request.get("stream_options")
    if isinstance(stream_options, dict) and stream_options.get("include_usage"):
        chunks.append({**head, "choices": [], "usage": _CHAT_USAGE})
    return [*map(_data_frame, chunks), _data_frame("[DONE]")]


@dataclass(frozen=True)
class _Api:
    """One wire protocol: how to read what a request says and which tools it offers, and how to answer."""

    said: Callable[[JSON], Iterator[_Said]]
    tools: Callable[[JSON], list[_Tool]]
    document: Callable[[_Turn], JSON]
    stream: Callable[[_Turn], list[str]]


_MODEL_APIS = {
    "/v1/messages": _Api(_anthropic_said, _anthropic_tools, _anthropic_document, _anthropic_stream),
    "/v1/responses": _Api(_responses_said, _responses_tools, _responses_document, _responses_stream),
    "/v1/chat/completions": _Api(_chat_said, _chat_tools, _chat_document, _chat_stream),
}
_MODELS = {
    "object": "list",
    "data": [
        {"id": model, "object": "model", "type": "model", "display_name": model, "created": 0,
         "owned_by": "scripted", "created_at": "2025-01-01T00:00:00Z"}
        for model in MODEL_IDS
    ],
    "has_more": False, "first_id": MODEL_IDS[0], "last_id": MODEL_IDS[-1],
}  # fmt: skip


# --- The server -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Document:
    """A JSON answer (None: an empty body), and what the log says was answered."""

    status: int
    body: JSON | None
    logged: Any


@dataclass(frozen=True)
class _Stream:
    """An SSE answer, already framed, and what the log says was answered."""

    frames: list[str]
    logged: Any
    status: int = 200


def _document(status: int, body: JSON | None) -> _Document:
    return _Document(status, body, body)


def _error(status: int, message: str) -> _Document:
    return _document(status, {"error": {"message": message}})


def _reply_summary(reply: _Reply) -> JSON:
    if isinstance(reply, _ToolCall):
        return {"tool_call": {"name": reply.name, "arguments": reply.arguments}}
    return {"text": reply.text}


class ScriptedModel:
    """The server, run in a thread of this process. `requests` holds one record per request, in order:
    `method`, `path`, `headers` (lower-cased, without secrets), `body` (the JSON, or the text), `status`, `answer`
    (a model turn's `{"tool_call": {name, arguments}}` or `{"text": …}`, or the JSON answered)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, command: str = DEFAULT_COMMAND, log_path: Path | None = None
    ) -> None:
        self.host, self.port, self.command, self.log_path = host, port, command, log_path
        self.requests: list[JSON] = []
        self._lock = threading.Lock()
        self._serials = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL, without `/v1` (Claude Code's `ANTHROPIC_BASE_URL`; the OpenAI clients add `/v1`)."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> int:
        """Bind, serve in a daemon thread, and return the bound port."""
        self._server = ThreadingHTTPServer((self.host, self.port), partial(_Handler, model=self))
        self.port = self._server.server_address[1]
        serve = partial(self._server.serve_forever, poll_interval=STOP_POLL_INTERVAL)
        self._thread = threading.Thread(target=serve, name="scripted-model", daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
        self._server = self._thread = None

    def __enter__(self) -> ScriptedModel:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, method: str, path: str, body: Any) -> _Document | _Stream:
        """The answer to one request (`body`: its JSON, or its text), by route."""
        route = urlsplit(path).path
        if method == "HEAD":
            return _document(200, None)
        if method == "GET" and route == "/v1/models":
            return _document(200, _MODELS)
        if method == "POST" and route == "/v1/messages/count_tokens":
            return _document(200, {"input_tokens": INPUT_TOKENS})
        api = _MODEL_APIS.get(route) if method == "POST" else None
        if api is None:
            return _error(404, f"no route {route}")
        if not isinstance(body, dict):
            return _error(400, "the body is not a JSON object")
        return self._turn(api, body)

    def _turn(self, api: _Api, request: JSON) -> _Document | _Stream:
        tools_offered = bool(_dicts(request.get("tools")))
        reply = _reply(api.said(request), api.tools(request), tools_offered, self.command)
        with self._lock:
            serial = next(self._serials)
        turn = _Turn(request, reply, serial, int(time.time()))
        if request.get("stream") is True:
            return _Stream(api.stream(turn), _reply_summary(reply))
        return _Document(200, api.document(turn), _reply_summary(reply))

    def record(self, entry: JSON) -> None:
        """Keep one request's record, and append it to the JSONL log if there is one."""
        with self._lock:
            self.requests.append(entry)
            if self.log_path is not None:
                with self.log_path.open("a", encoding="utf-8") as log:
                    log.write(json.dumps(entry) + "\n")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive for documents; streams end with `Connection: close`
    server_version = "scripted-model"

    def __init__(self, *args: Any, model: ScriptedModel, **kwargs: Any) -> None:
        self.model = model  # before the base class handles the request
        super().__init__(*args, **kwargs)

    def do_HEAD(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_POST  # noqa: N815 (404, not the base class's 501)

    def _handle(self) -> None:
        body = _parsed(self._read_body())
        answer = self.model.answer(self.command, self.path, body)
        headers = {name.lower(): value for name, value in self.headers.items() if name.lower() not in SECRET_HEADERS}
        self.model.record({
            "method": self.command, "path": self.path, "headers": headers, "body": body,
            "status": answer.status, "answer": answer.logged,
        })  # fmt: skip
        try:
            if isinstance(answer, _Stream):
                self._send_stream(answer.frames)
            else:
                self._send_document(answer)
        except ConnectionError:  # the client went away
            self.close_connection = True

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _read_chunked(self) -> bytes:
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0].strip(), 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after the chunk
        while self.rfile.readline().strip():  # trailers, up to the blank line
            pass
        return b"".join(chunks)

    def _send_document(self, answer: _Document) -> None:
        payload = b"" if answer.body is None else json.dumps(answer.body).encode()
        self.send_response(answer.status)
        if answer.body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _send_stream(self, frames: list[str]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream ends when the connection does
        self.end_headers()
        for number, frame in enumerate(frames):
            if number:
                time.sleep(EVENT_DELAY)
            self.wfile.write(frame.encode())
            self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the requests are logged as records, not on stderr."""


def _parsed(raw: bytes) -> Any:
    """The body as JSON if it is JSON, else as text."""
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text) if text else ""
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A deterministic scripted model server (Anthropic and OpenAI APIs).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (the one bound is printed)")
    parser.add_argument("--log", type=Path, help="append one JSON line per request to this file")
    parser.add_argument("--command", default=DEFAULT_COMMAND, help="the shell command of the tool call")
    args = parser.parse_args(argv)
    # Blocked in every thread (the server's inherit the mask), so they wait for `sigwait` here: a handler could
    # run in a server thread and leave the main one asleep.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    model = ScriptedModel(args.host, args.port, command=args.command, log_path=args.log)
    port = model.start()
    print(f"listening {args.host}:{port}", flush=True)
    signal.sigwait(stop_signals)
    model.stop()


if __name__ == "__main__":
    main()
