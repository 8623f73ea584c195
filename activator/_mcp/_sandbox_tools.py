"""The tools `sandboxExecutor` runs inside a sandbox: which ones a template has, their schemas, and what they do."""

from __future__ import annotations

import base64
import binascii
import socket
from typing import Any, NamedTuple

from msgspec import UnsetType

from activator._errors import PortNotOpen
from activator._mcp._arguments import (
    Click,
    Evaluate,
    GetUrl,
    ListFiles,
    Navigate,
    OpenUrl,
    PageScreenshot,
    PageText,
    Press,
    ReadFile,
    RunCode,
    RunCommand,
    SandboxToolArgs,
    Screenshot,
    Scroll,
    TypeText,
    WriteFile,
    input_schema,
)
from activator._mcp._browser import BROWSER_TOOL_DESCRIPTIONS, run_browser_tool
from activator._mcp._desktop import DESKTOP_TOOL_DESCRIPTIONS, run_desktop_tool
from activator._mcp._envd import Entry, Envd
from activator._mcp._errors import BadArguments, UnknownTool
from activator._mcp._interpreter import INTERPRETER_PORT, execute
from activator._mcp._output import MAX_FILE_BYTES, MAX_LIST_ENTRIES, MAX_STREAM_BYTES, cut_marker
from activator._mcp._sandbox import SandboxAccess, SandboxUrls
from pool import ENVD_PORT, Template

__all__ = ["SandboxTool", "run_sandbox_tool", "sandbox_tools"]

_FOREGROUND_TIMEOUT = 60.0
_INTERPRETER_TEMPLATES = frozenset({"code-interpreter-v1", "code-interpreter"})
_ENTRY_TYPES = {"FILE_TYPE_FILE": "file", "FILE_TYPE_DIRECTORY": "dir", "FILE_TYPE_SYMLINK": "symlink"}


class SandboxTool(NamedTuple):
    """A tool of a sandbox, as listed to the model."""

    name: str
    description: str
    args: type[SandboxToolArgs]

    def listing(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "inputSchema": input_schema(self.args)}


_COMMON = (
    SandboxTool(
        "run_command",
        "Run a bash command line in the sandbox (`bash -l -c`, as the template's user, in /home/user unless cwd "
        "says otherwise) and return exitCode, stdout and stderr. A non-zero exitCode is a normal result. Files "
        "persist between calls; shell state (cd, exported variables) does not. Output is cut to "
        f"{MAX_STREAM_BYTES // 1024} KiB per stream (the first and last halves, with a marker saying how much was "
        "dropped). For servers and anything long-running set background: true: it returns the pid at once and "
        "discards the output, so redirect it to a file (`node server.js > server.log 2>&1`), then use get_url.",
        RunCommand,
    ),
    SandboxTool(
        "read_file",
        f"Read a file of the sandbox. Text is returned as is, other bytes as base64 (`encoding` says which). At "
        f"most {MAX_FILE_BYTES // 1024} KiB are returned, with a marker saying how much was cut.",
        ReadFile,
    ),
    SandboxTool(
        "write_file",
        "Create or overwrite a file of the sandbox with `content`; missing parent directories are created. "
        "Use it to put code and configuration into the sandbox, then run it with run_command.",
        WriteFile,
    ),
    SandboxTool(
        "list_files",
        f"List a directory of the sandbox, `depth` levels deep: name, path, type (file, dir, symlink) and size "
        f"of each entry, at most {MAX_LIST_ENTRIES} entries.",
        ListFiles,
    ),
    SandboxTool(
        "get_url",
        "The public URL at which the gateway serves a port of the sandbox, e.g. of a web server started with "
        "run_command in the background: give this address to the user. `listening` says whether something "
        "accepts connections on the port right now.",
        GetUrl,
    ),
)
_RUN_CODE = SandboxTool(
    "run_code",
    "Run code in the sandbox's code interpreter, like a notebook cell: variables and imports persist between "
    "calls of the same language. Returns stdout, stderr, results (the text form of displayed values, the last "
    "expression's included) and error (name, value, traceback) when it raised.",
    RunCode,
)


_DESKTOP = tuple(
    SandboxTool(name, DESKTOP_TOOL_DESCRIPTIONS[name], args)
    for name, args in (
        ("screenshot", Screenshot), ("click", Click), ("type", TypeText), ("press", Press), ("scroll", Scroll),
        ("open_url", OpenUrl),
    )
)  # fmt: skip


_BROWSER = tuple(
    SandboxTool(name, BROWSER_TOOL_DESCRIPTIONS[name], args)
    for name, args in (
        ("navigate", Navigate), ("evaluate", Evaluate), ("page_text", PageText), ("page_screenshot", PageScreenshot),
    )
)  # fmt: skip


def sandbox_tools(template: Template | None) -> tuple[SandboxTool, ...]:
    """The tools of sandboxes of `template`: the common ones, plus run_code where the code interpreter runs and
    the desktop tools where the template has a desktop."""
    if template is None:
        return _COMMON
    interpreter = template.name in _INTERPRETER_TEMPLATES or INTERPRETER_PORT in template.ports
    desktop, browser = "desktop" in template.mcp_tools, "browser" in template.mcp_tools
    return (
        *_COMMON,
        *((_RUN_CODE,) if interpreter else ()),
        *(_DESKTOP if desktop else ()),
        *(_BROWSER if browser else ()),
    )


def find_tool(template: Template | None, name: str) -> SandboxTool:
    """The tool `name` of sandboxes of `template`, or UnknownTool listing the ones there are."""
    tools = sandbox_tools(template)
    for tool in tools:
        if tool.name == name:
            return tool
    known = ", ".join(tool.name for tool in tools)
    raise UnknownTool(f"this sandbox has no tool {name!r}; its tools are: {known} (schemas: getSandbox `tools`)")


async def run_sandbox_tool(access: SandboxAccess, urls: SandboxUrls, args: SandboxToolArgs) -> dict[str, Any]:
    """Run one sandbox tool; the result is the tool's structured output."""
    match args:
        case RunCommand():
            return await _run_command(access, args)
        case ReadFile():
            return await _read_file(_envd(access), args)
        case WriteFile():
            return await _write_file(_envd(access), args)
        case ListFiles():
            return await _list_files(_envd(access), args)
        case GetUrl():
            return await _get_url(access, urls, args)
        case RunCode():
            return await _run_code(access, args)
        case Screenshot() | Click() | TypeText() | Press() | Scroll() | OpenUrl():
            return await run_desktop_tool(_envd(access), args)
        case Navigate() | Evaluate() | PageText() | PageScreenshot():
            return await run_browser_tool(access.connect, args)


def _envd(access: SandboxAccess) -> Envd:
    async def connect() -> socket.socket:
        return await access.connect(ENVD_PORT)

    return Envd(connect, user=access.template.user, token=access.record.access_token)


async def _run_command(access: SandboxAccess, args: RunCommand) -> dict[str, Any]:
    envd = _envd(access)
    timeout = None if isinstance(args.timeout, UnsetType) else args.timeout
    if args.background:
        pid = await envd.start(args.command, cwd=args.cwd, envs=args.envs, kill_after=timeout)
        return {"pid": pid, "background": True}
    output = await envd.run(args.command, cwd=args.cwd, envs=args.envs, kill_after=timeout or _FOREGROUND_TIMEOUT)
    return {"exitCode": output.exit_code, "stdout": output.stdout, "stderr": output.stderr}


async def _read_file(envd: Envd, args: ReadFile) -> dict[str, Any]:
    content = await envd.read_file(args.path, MAX_FILE_BYTES)
    dropped = content.size - len(content.data)
    text = _utf8(content.data, cut=dropped > 0)
    result: dict[str, Any] = {"path": args.path, "size": content.size}
    marker = ""
    if dropped > 0:
        hint = f"read_file returns the first {MAX_FILE_BYTES} bytes; use run_command (tail, sed -n, grep) for the rest"
        marker = cut_marker(dropped, args.path, hint)
    if text is None:
        result |= {"encoding": "base64", "content": base64.b64encode(content.data).decode()}
        if marker:
            result["note"] = marker.strip()
    else:
        result |= {"encoding": "utf-8", "content": text + marker}
    return result


def _utf8(data: bytes, *, cut: bool) -> str | None:
    """`data` as text, or None if it is not UTF-8 (a character split by the cut does not count)."""
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        if cut and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data":
            return data[: exc.start].decode()
        return None


async def _write_file(envd: Envd, args: WriteFile) -> dict[str, Any]:
    if args.encoding == "base64":
        try:
            data = base64.b64decode(args.content, validate=True)
        except binascii.Error as exc:
            message = f"write_file: content is not valid base64 ({exc}); send text with encoding utf-8"
            raise BadArguments(message) from exc
    else:
        data = args.content.encode()
    path = await envd.write_file(args.path, data)
    return {"path": path, "bytes": len(data)}


async def _list_files(envd: Envd, args: ListFiles) -> dict[str, Any]:
    entries = await envd.list_dir(args.path, args.depth)
    result: dict[str, Any] = {"path": args.path, "entries": [_entry(entry) for entry in entries[:MAX_LIST_ENTRIES]]}
    if len(entries) > MAX_LIST_ENTRIES:
        more = len(entries) - MAX_LIST_ENTRIES
        result["note"] = f"[... {more} more entries not shown: list a narrower path or a smaller depth ...]"
    return result


def _entry(entry: Entry) -> dict[str, Any]:
    listed: dict[str, Any] = {"name": entry.name, "path": entry.path, "type": _ENTRY_TYPES.get(entry.type, "other")}
    listed["size"] = int(entry.size)
    if entry.symlink_target:
        listed["target"] = entry.symlink_target
    return listed


async def _get_url(access: SandboxAccess, urls: SandboxUrls, args: GetUrl) -> dict[str, Any]:
    try:
        (await access.connect(args.port)).close()
        listening = True
    except PortNotOpen:
        listening = False
    return {"port": args.port, "url": urls.url(access.record.id, args.port), "listening": listening}


async def _run_code(access: SandboxAccess, args: RunCode) -> dict[str, Any]:
    async def connect() -> socket.socket:
        return await access.connect(INTERPRETER_PORT)

    execution = await execute(connect, args.code, args.language, args.timeout, token=access.record.access_token)
    return {"stdout": execution.stdout, "stderr": execution.stderr, "results": execution.results} | (
        {"error": execution.error} if execution.error else {}
    )
