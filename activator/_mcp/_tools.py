"""The MCP tools: create, get, list and delete sandboxes, run a sandbox tool inside one, and drive coding-agent
sessions in one (`_agent_sessions`).

Each acts for the owner of the calling API key, through the same `Activator` calls as the E2B API, so a key sees
only its own sandboxes here as there.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from activator._activator import Activator
from activator._catalog import TemplateNotFound
from activator._mcp._agent_sessions import AgentSessionArgs, run_agent_session_tool
from activator._mcp._arguments import (
    MAX_EVENTS_PAGE,
    MAX_WAIT_SECONDS,
    CreateAgentSession,
    CreateSandbox,
    DeleteSandbox,
    GetAgentSessionEvents,
    GetSandbox,
    ListAgentSessions,
    ListSandbox,
    PromptAgentSession,
    ReplyAgentPermission,
    SandboxExecutor,
    TerminateAgentSession,
    ToolArgs,
    input_schema,
    parse,
)
from activator._mcp._errors import ToolError
from activator._mcp._output import Rendered
from activator._mcp._sandbox import SandboxAccess, SandboxUrls, describe
from activator._mcp._sandbox_tools import find_tool, run_sandbox_tool, sandbox_tools
from activator._records import CreateRequest, Lifecycle, SandboxRecord, SandboxState
from pool import Template

__all__ = ["ControlTools"]

_STATES = {"running": SandboxState.RUNNING, "paused": SandboxState.PAUSED}
_PAGE = 100
_AGENT_TOOLS: dict[str, type[AgentSessionArgs]] = {
    "createAgentSession": CreateAgentSession,
    "promptAgentSession": PromptAgentSession,
    "getAgentSessionEvents": GetAgentSessionEvents,
    "replyAgentPermission": ReplyAgentPermission,
    "listAgentSessions": ListAgentSessions,
    "terminateAgentSession": TerminateAgentSession,
}


class ControlTools:
    """The tools of one server, listed with their schemas and called by name."""

    def __init__(self, activator: Activator, urls: SandboxUrls) -> None:
        self._activator = activator
        self._urls = urls
        self._templates = activator.catalog.templates
        self._tools = _listing(self._template_lines())
        self._schemas = {tool.name: tool.input_schema for tool in self._tools}

    def listing(self) -> list[types.Tool]:
        return list(self._tools)

    def schema(self, name: str) -> dict[str, Any] | None:
        return self._schemas.get(name)

    async def call(self, owner: str, name: str, arguments: dict[str, Any] | None) -> dict[str, Any] | Rendered:
        """Run tool `name`; raises ToolError or ActivatorError for anything the model should hear about."""
        if name in _AGENT_TOOLS:
            return await run_agent_session_tool(self._activator, owner, parse(_AGENT_TOOLS[name], arguments, name))
        match name:
            case "createSandbox":
                return await self._create(owner, parse(CreateSandbox, arguments, name))
            case "getSandbox":
                return self._described(self._activator.get(owner, parse(GetSandbox, arguments, name).sandbox_id))
            case "listSandbox":
                return await self._list(owner, parse(ListSandbox, arguments, name))
            case "deleteSandbox":
                sandbox_id = parse(DeleteSandbox, arguments, name).sandbox_id
                await self._activator.kill(owner, sandbox_id)
                return {"sandboxId": sandbox_id, "deleted": True}
            case "sandboxExecutor":
                return await self._execute(owner, parse(SandboxExecutor, arguments, name))
        raise LookupError(name)  # the server checks names against the listing first

    def knows(self, name: str) -> bool:
        return name in self._schemas

    async def _create(self, owner: str, args: CreateSandbox) -> dict[str, Any]:
        lifecycle = Lifecycle(on_timeout=args.on_timeout, auto_resume=args.on_timeout == "pause")
        request = CreateRequest(
            template=args.template,
            timeout=args.timeout,
            metadata=args.metadata,
            env_vars=args.envs,
            lifecycle=lifecycle,
        )
        try:
            record = await self._activator.create(owner, request)
        except TemplateNotFound as exc:
            catalog = self._activator.catalog
            known = ", ".join([*sorted(catalog.builtins()), *(record.name for record in catalog.built(owner))])
            raise ToolError(f"{exc.message}; the templates are: {known}") from exc
        return self._described(record)

    async def _list(self, owner: str, args: ListSandbox) -> dict[str, Any]:
        states = [_STATES[state] for state in args.state] or list(_STATES.values())
        page = await self._activator.list(
            owner, states=states, metadata=args.metadata, next_token=args.next_token or None, limit=_PAGE
        )
        listed: dict[str, Any] = {"sandboxes": [describe(r, self._urls, self._template(r)) for r in page.records]}
        if page.next_token:
            listed["nextToken"] = page.next_token
        return listed

    async def _execute(self, owner: str, args: SandboxExecutor) -> dict[str, Any]:
        record = self._activator.get(owner, args.sandbox_id)
        template = self._template(record)
        tool = find_tool(template, args.tool)
        tool_args = parse(tool.args, args.arguments, tool.name)
        if template is None:
            raise ToolError(f"the template {record.template!r} of this sandbox is no longer loaded; delete it")
        access = SandboxAccess(self._activator, owner, record, template)
        return await run_sandbox_tool(access, self._urls, tool_args)

    def _described(self, record: SandboxRecord) -> dict[str, Any]:
        template = self._template(record)
        tools = [tool.listing() for tool in sandbox_tools(template)]
        return describe(record, self._urls, template) | {"tools": tools}

    def _template(self, record: SandboxRecord) -> Template | None:
        return self._templates.get(record.template)

    def _template_lines(self) -> str:
        builtins = self._activator.catalog.builtins()
        return "\n".join(f"- {name}: {tpl.description}" for name, tpl in sorted(builtins.items()))


def _listing(templates: str) -> tuple[types.Tool, ...]:
    """The tools, described for a model that knows nothing of this server."""
    return (
        _tool(
            "createSandbox",
            "Create a new sandbox: an isolated Linux machine of its own in which commands, files and servers "
            "cannot touch anything else. Returns it (sandboxId, state, URLs) and `tools`: the sandbox tools that "
            "sandboxExecutor runs in it, each with its input schema. It lives `timeout` seconds (default one "
            "hour); call deleteSandbox when done. An idle sandbox is paused and wakes on the next call.\n"
            f"Templates:\n{templates}",
            CreateSandbox,
        ),
        _tool(
            "getSandbox",
            "One of your sandboxes by sandboxId: its state (running or paused), URLs, when it times out, and its "
            "`tools` with their input schemas.",
            GetSandbox,
            read_only=True,
        ),
        _tool(
            "listSandbox",
            f"Your sandboxes, newest first, at most {_PAGE} per call: those whose metadata contain every given "
            "pair, in the given states. When there are more, pass the returned nextToken to get them.",
            ListSandbox,
            read_only=True,
        ),
        _tool(
            "deleteSandbox",
            "Delete a sandbox for good: its processes stop, its files are gone and its URLs stop answering.",
            DeleteSandbox,
            destructive=True,
        ),
        _tool(
            "sandboxExecutor",
            "Run one tool inside a sandbox: `tool` is its name and `arguments` its input, as listed in `tools` of "
            "createSandbox and getSandbox. Every sandbox has run_command {command, cwd, envs, timeout, background}, "
            "read_file {path}, write_file {path, content}, list_files {path, depth} and get_url {port}; templates "
            "with a code interpreter also have run_code {code, language}. A paused sandbox is woken first.",
            SandboxExecutor,
        ),
        *_AGENT_LISTING,
    )


def _tool(
    name: str,
    description: str,
    args: type[ToolArgs],
    *,
    read_only: bool = False,
    destructive: bool = False,
) -> types.Tool:
    annotations = types.ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive, open_world_hint=False)
    return types.Tool(name=name, description=description, input_schema=input_schema(args), annotations=annotations)


_AGENT_LISTING = (
    _tool(
        "createAgentSession",
        "Start a coding-agent session in a sandbox, to delegate a task to a coding agent that works inside it "
        "(its files, its commands). Agents: mock (built in: it answers, and runs each prompt line `$ <command>` "
        "as a tool call), and claude, codex, opencode, pi where installed (template coding-agents), with their "
        "model credentials in `env`. Then promptAgentSession sends it the task and getAgentSessionEvents reads "
        "what it does. By default the agent asks before acting: answer with replyAgentPermission.",
        CreateAgentSession,
    ),
    _tool(
        "promptAgentSession",
        "Send a message (a task, an answer, a correction) to a coding-agent session: it starts a turn that runs "
        "on in the sandbox, and returns at once with the `offset` to read the turn's events from with "
        "getAgentSessionEvents. One turn at a time: while one runs, this is refused.",
        PromptAgentSession,
    ),
    _tool(
        "getAgentSessionEvents",
        "Read what a coding-agent session did, from an offset: a transcript (messages, reasoning, tool calls "
        "and their results, permission requests, errors, turns) as text, and the events themselves as JSON. "
        f"While a turn runs it waits up to waitSeconds (default 30, at most {MAX_WAIT_SECONDS}) for the turn to "
        "end or to request a permission, so call it again with the returned nextOffset until the turn ended. At "
        f"most `limit` events (at most {MAX_EVENTS_PAGE}) and about 256 KiB per call; hasMore says there are more. "
        "After the sandbox is killed its sessions stay readable here (the server's copy, same offsets).",
        GetAgentSessionEvents,
        read_only=True,
    ),
    _tool(
        "replyAgentPermission",
        "Answer a permission request of a coding-agent session (a permission.requested event, shown as "
        "PERMISSION REQUESTED in the transcript): once allows this action, always allows it and the like for the "
        "rest of the session, reject refuses it. Unanswered, a request takes the session's permissionDefault "
        "(reject) after its permissionTimeoutMs.",
        ReplyAgentPermission,
    ),
    _tool(
        "listAgentSessions",
        "The coding-agent sessions of a sandbox, newest first (id, agent, event count, whether a turn runs or "
        "it ended), and the agents it has (installed or not, and why not); of a killed sandbox, the sessions the "
        "server kept.",
        ListAgentSessions,
        read_only=True,
    ),
    _tool(
        "terminateAgentSession",
        "End a coding-agent session: a running turn is cancelled and the agent's processes stop. Its events stay "
        "readable with getAgentSessionEvents.",
        TerminateAgentSession,
        destructive=True,
    ),
)
