"""Jupyter IOPub messages of one execution, as the NDJSON lines the SDK reads (e2b-protocol.md §4.2).

The mapping follows the reference server: `execute_input` gives the execution count, `stream` becomes
stdout / stderr stamped with the message's own time, `execute_result` is the main result and
`display_data` (matplotlib figures, `display(...)`) the others, `error` joins the traceback lines.
Messages that say nothing to the SDK (status, clear_output, comm traffic) map to nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from executor.interpreter._wire import Error, Line, NumberOfExecutions, Stderr, Stdout, now, result_from_bundle

__all__ = ("is_idle", "line_from_message")


def line_from_message(message: dict[str, Any]) -> Line | None:
    """The line for one IOPub message of the execution, or None when the SDK has no use for it."""
    kind = message.get("msg_type")
    content: dict[str, Any] = message.get("content") or {}
    match kind:
        case "execute_input":
            return NumberOfExecutions(execution_count=int(content.get("execution_count") or 0))
        case "stream":
            stamp = _timestamp(message)
            text = str(content.get("text", ""))
            return (
                Stderr(text=text, timestamp=stamp)
                if content.get("name") == "stderr"
                else Stdout(text=text, timestamp=stamp)
            )
        case "execute_result" | "display_data" | "update_display_data":
            return result_from_bundle(dict(content.get("data") or {}), is_main_result=kind == "execute_result")
        case "error":
            return _error(content)
    return None


def is_idle(message: dict[str, Any]) -> bool:
    """Whether the kernel says it is done with the request (the last IOPub message of an execution)."""
    return message.get("msg_type") == "status" and (message.get("content") or {}).get("execution_state") == "idle"


def _error(content: dict[str, Any]) -> Error:
    # bash_kernel reports a failing command with an empty name and the exit status as the value.
    name = str(content.get("ename") or "Error")
    value = str(content.get("evalue", ""))
    traceback = "\n".join(str(line) for line in content.get("traceback") or ()) or f"{name}: {value}"
    return Error(name=name, value=value, traceback=traceback)


def _timestamp(message: dict[str, Any]) -> str:
    date = (message.get("header") or {}).get("date")
    if isinstance(date, datetime):
        return date.isoformat()
    return date if isinstance(date, str) else now()
