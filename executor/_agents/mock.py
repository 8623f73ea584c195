"""The builtin `mock` agent: a real ACP agent on stdio that completes every session, for demos and tests.

Run by the agent server as `python3 -I -S mock.py`; the standard library only. A prompt is answered
with streamed text that echoes it. A line of the prompt that starts with `$ ` is a shell command the
agent runs as a tool call, after asking for permission (`session/request_permission`) unless the
session's mode is `bypass`; the command's output goes back as the tool call's result. It also answers
the `_sandboxagent/agent/list` and `_sandboxagent/agent/install` extension methods that the
sandbox-agent CLI sends to the mock (its `api agents` subcommands): the list from `SANDBOX_AGENT_CATALOG`
(a JSON file the server writes for it), an install with an error naming the route that installs.
`session/cancel` ends the running prompt with `cancelled`: the command running then is killed with
its descendants, and a permission request still open counts as refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Any

VERSION = "1.0.0"
CHUNK_WORDS = 3
TOOL_TIMEOUT_SECONDS = 60
OUTPUT_LIMIT = 64 * 1024

_write_lock = threading.Lock()
_responses: dict[str, dict[str, Any]] = {}
_response_ready = threading.Condition()
_cancelled: set[str] = set()  # guarded by _response_ready, which waiters on a permission share
_running: dict[str, subprocess.Popen[bytes]] = {}  # session id -> its running tool command (same guard)
MODES = ("normal", "plan", "bypass")
_modes: dict[str, str] = {}


def send(message: dict[str, Any]) -> None:
    line = json.dumps({"jsonrpc": "2.0", **message}, separators=(",", ":"))
    with _write_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def update(session_id: str, body: dict[str, Any]) -> None:
    send({"method": "session/update", "params": {"sessionId": session_id, "update": body}})


def ask(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send a request to the client and wait for its response (a cancelled outcome once the turn is cancelled)."""
    request_id = f"mock-{uuid.uuid4().hex[:12]}"
    session_id = params.get("sessionId", "")
    send({"id": request_id, "method": method, "params": params})
    with _response_ready:
        _response_ready.wait_for(lambda: request_id in _responses or session_id in _cancelled)
        return _responses.pop(request_id, None) or {"result": {"outcome": {"outcome": "cancelled"}}}


def stream_text(session_id: str, text: str, kind: str = "agent_message_chunk") -> None:
    words = text.split(" ")
    for start in range(0, len(words), CHUNK_WORDS):
        piece = " ".join(words[start : start + CHUNK_WORDS]) + (" " if start + CHUNK_WORDS < len(words) else "")
        update(session_id, {"sessionUpdate": kind, "content": {"type": "text", "text": piece}})


def run_tool(session_id: str, call_id: str, command: str, cwd: str) -> None:
    tool = {"toolCallId": call_id, "title": f"Run `{command}`", "kind": "execute", "rawInput": {"command": command}}
    update(session_id, {"sessionUpdate": "tool_call", "status": "pending", "content": [], **tool})
    if _modes.get(session_id) != "bypass":
        options = [
            {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
            {"optionId": "allow_always", "name": "Always allow", "kind": "allow_always"},
            {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
        ]
        answer = ask("session/request_permission", {"sessionId": session_id, "toolCall": tool, "options": options})
        outcome = (answer.get("result") or {}).get("outcome") or {}
        if outcome.get("outcome") != "selected" or outcome.get("optionId") not in ("allow", "allow_always"):
            update(session_id, _tool_update(call_id, "failed", "User refused permission to run tool"))
            return
    update(session_id, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "in_progress"})
    output, status = _run_command(session_id, command, cwd)
    update(session_id, _tool_update(call_id, status, output))


def _run_command(session_id: str, command: str, cwd: str) -> tuple[str, str]:
    """The command's output and the tool call's status; a cancel or the timeout kills it and what it started."""
    try:
        child = subprocess.Popen(
            ["/bin/sh", "-c", command],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
    except OSError as exc:
        return str(exc), "failed"
    with _response_ready:
        _running[session_id] = child
        cancelled = session_id in _cancelled
    if cancelled:
        _kill_tree(child.pid)
    try:
        stdout, stderr = child.communicate(timeout=TOOL_TIMEOUT_SECONDS)
        ended = ""
    except subprocess.TimeoutExpired:
        _kill_tree(child.pid)
        stdout, stderr = _leftovers(child)
        ended = f"\n(killed after {TOOL_TIMEOUT_SECONDS} s)"
    finally:
        with _response_ready:
            _running.pop(session_id, None)
    with _response_ready:
        if session_id in _cancelled:
            ended = "\n(cancelled)"
    output = (stdout + stderr)[:OUTPUT_LIMIT].decode("utf-8", "replace") + ended
    return output, "completed" if child.returncode == 0 and not ended else "failed"


def _leftovers(child: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """What a killed command wrote; nothing if something it started escaped and still holds its pipes."""
    try:
        stdout, stderr = child.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        child.wait()
        return b"", b""
    return stdout, stderr


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (they stay in the agent's process group, which DELETE ends)."""
    for target in [pid, *_descendants(pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _tool_update(call_id: str, status: str, output: str) -> dict[str, Any]:
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": call_id,
        "status": status,
        "rawOutput": {"output": output},
        "content": [{"type": "content", "content": {"type": "text", "text": output}}],
    }


def prompt(request_id: Any, params: dict[str, Any], cwds: dict[str, str]) -> None:
    session_id = params.get("sessionId", "")
    text = " ".join(part.get("text", "") for part in params.get("prompt", []) if part.get("type") == "text")
    with _response_ready:
        _cancelled.discard(session_id)
    stream_text(session_id, f"Thinking about: {text}", "agent_thought_chunk")
    commands = [line[2:].strip() for line in text.splitlines() if line.startswith("$ ")]
    for index, command in enumerate(commands):
        if session_id in _cancelled:
            break
        run_tool(session_id, f"mock-call-{uuid.uuid4().hex[:8]}-{index}", command, cwds.get(session_id, "/"))
    if session_id in _cancelled:
        send({"id": request_id, "result": {"stopReason": "cancelled"}})
        return
    stream_text(session_id, f"Mock reply to: {text}" if not commands else f"Ran {len(commands)} command(s).")
    usage = {"inputTokens": len(text.split()), "outputTokens": 5, "totalTokens": len(text.split()) + 5}
    send({"id": request_id, "result": {"stopReason": "end_turn", "usage": usage}})


def cancel(session_id: str) -> None:
    """Cancel the session's turn: its open permission request is refused, its running command killed."""
    with _response_ready:
        _cancelled.add(session_id)
        _response_ready.notify_all()
        running = _running.get(session_id)
    if running is not None:
        _kill_tree(running.pid)


def config_options(session_id: str) -> list[dict[str, Any]]:
    mode = _modes.get(session_id, "normal")
    return [
        {
            "id": "mode",
            "name": "Mode",
            "category": "mode",
            "type": "select",
            "currentValue": mode,
            "options": [{"value": value, "name": value.title()} for value in MODES],
        }
    ]


def catalog() -> dict[str, Any]:
    path = os.environ.get("SANDBOX_AGENT_CATALOG")
    if not path:
        return {"agents": []}
    with open(path) as file:
        loaded: dict[str, Any] = json.load(file)
    return loaded


def handle(message: dict[str, Any], cwds: dict[str, str]) -> None:
    method, request_id, params = message.get("method"), message.get("id"), message.get("params") or {}
    if method == "initialize":
        result: Any = {
            "protocolVersion": 1,
            "agentCapabilities": {"loadSession": False, "promptCapabilities": {}},
            "agentInfo": {"name": "agent-sandbox-mock", "title": "Mock agent", "version": VERSION},
            "authMethods": [],
        }
    elif method == "session/new":
        session_id = f"mock-{uuid.uuid4()}"
        cwds[session_id] = params.get("cwd") or os.getcwd()
        result = {"sessionId": session_id, "configOptions": config_options(session_id)}
    elif method in ("session/set_mode", "session/set_config_option"):
        session_id = params.get("sessionId", "")
        option = "mode" if method == "session/set_mode" else params.get("configId")
        value = params.get("modeId") if method == "session/set_mode" else params.get("value")
        if option != "mode" or value not in MODES:
            error = {"code": -32602, "message": f"unknown {option} {value!r}: the mock has modes {', '.join(MODES)}"}
            send({"id": request_id, "error": error})
            return
        _modes[session_id] = value
        result = {"configOptions": config_options(session_id)}
    elif method == "session/prompt":
        threading.Thread(target=prompt, args=(request_id, params, cwds), daemon=True).start()
        return
    elif method == "session/cancel":
        cancel(params.get("sessionId", ""))
        return
    elif method == "_sandboxagent/agent/list":
        result = catalog()
    elif method == "_sandboxagent/agent/install":
        named = params.get("agent") or "<agent>"
        detail = f"the CLI cannot install through the mock agent: POST /v1/agents/{named}/install does"
        send({"id": request_id, "error": {"code": -32603, "message": detail}})
        return
    elif request_id is None:
        return  # an unknown notification
    else:
        send({"id": request_id, "error": {"code": -32601, "message": f"method not found: {method}"}})
        return
    if request_id is not None:
        send({"id": request_id, "result": result})


def main() -> int:
    cwds: dict[str, str] = {}
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            send({"id": None, "error": {"code": -32700, "message": "parse error"}})
            continue
        if not isinstance(message, dict):
            continue
        if "method" not in message and "id" in message:
            with _response_ready:
                _responses[str(message["id"])] = message
                _response_ready.notify_all()
            continue
        handle(message, cwds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
