"""The arguments of every tool, as msgspec structs: one definition gives both the JSON schema shown to the model
and the validation of what it sends.

The schemas stay flat (no `$ref`, no `anyOf`): protocol versions before 2026-07-28 define only `type`,
`properties` and `required` for tool input schemas, and models fill flat schemas most reliably.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from activator._mcp._errors import BadArguments
from executor.agent_api import SESSION_ID_PATTERN
from executor.envd import EnvVars

__all__ = [
    "AGENT_SESSION_ID",
    "MAX_EVENTS_PAGE",
    "MAX_WAIT_SECONDS",
    "BrowserToolArgs",
    "Click",
    "CreateAgentSession",
    "CreateSandbox",
    "DeleteSandbox",
    "DesktopToolArgs",
    "Evaluate",
    "GetAgentSessionEvents",
    "GetSandbox",
    "GetUrl",
    "ListAgentSessions",
    "ListFiles",
    "ListSandbox",
    "Navigate",
    "OpenUrl",
    "PageScreenshot",
    "PageText",
    "Press",
    "PromptAgentSession",
    "ReadFile",
    "ReplyAgentPermission",
    "RunCode",
    "RunCommand",
    "SandboxExecutor",
    "SandboxToolArgs",
    "Screenshot",
    "Scroll",
    "TerminateAgentSession",
    "ToolArgs",
    "TypeText",
    "WriteFile",
    "input_schema",
    "parse",
]

MAX_TIMEOUT = 86_400  # the longest sandbox TTL (the activator enforces its configured maximum as well)

_SandboxId = Annotated[str, Meta(min_length=1, description="The sandboxId returned by createSandbox.")]
_Strings = dict[str, str]
_State = Literal["running", "paused"]


class ToolArgs(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, rename="camel"):
    """Tool arguments: camelCase keys; an unknown key is a mistake the model should hear about, so it is refused."""


class CreateSandbox(ToolArgs):
    template: Annotated[
        str, Meta(min_length=1, description="The template to start from (listed above, or one your key built).")
    ] = "base"
    timeout: Annotated[
        int, Meta(ge=1, le=MAX_TIMEOUT, description="Seconds the sandbox lives before onTimeout applies.")
    ] = 3600
    on_timeout: Annotated[
        Literal["kill", "pause"],
        Meta(description="At the timeout: 'kill' deletes it; 'pause' freezes it, and a request to its URLs wakes it."),
    ] = "kill"
    metadata: Annotated[_Strings, Meta(description="Labels to find it again with listSandbox.")] = {}
    envs: Annotated[EnvVars, Meta(description="Environment variables of every command run in the sandbox.")] = {}


class GetSandbox(ToolArgs):
    sandbox_id: _SandboxId


class DeleteSandbox(ToolArgs):
    sandbox_id: _SandboxId


class ListSandbox(ToolArgs):
    metadata: Annotated[_Strings, Meta(description="Only sandboxes whose metadata contain all these pairs.")] = {}
    state: Annotated[
        list[_State], Meta(description="Only sandboxes in these states (default: running and paused).")
    ] = msgspec.field(default_factory=lambda: ["running", "paused"])
    next_token: Annotated[str, Meta(description="The nextToken of the previous page, to get the next one.")] = ""


class SandboxExecutor(ToolArgs):
    sandbox_id: _SandboxId
    tool: Annotated[
        str, Meta(min_length=1, description="The sandbox tool: run_command, read_file, write_file, list_files, ...")
    ]
    arguments: Annotated[
        dict[str, Any], Meta(description="The tool's arguments, matching its inputSchema in createSandbox's `tools`.")
    ] = {}


AGENT_SESSION_ID = SESSION_ID_PATTERN  # the agent server's own rule for session ids
MAX_EVENTS_PAGE = 1000
MAX_WAIT_SECONDS = 300
_SessionId = Annotated[str, Meta(pattern=AGENT_SESSION_ID, description="The sessionId createAgentSession returned.")]
_Option = Annotated[str, Meta(min_length=1, max_length=200)]


class CreateAgentSession(ToolArgs):
    sandbox_id: _SandboxId
    session_id: (
        Annotated[
            str,
            Meta(
                pattern=AGENT_SESSION_ID,
                description="An id of your choice for the new session: 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit (default: a new random one).",
            ),
        ]
        | UnsetType
    ) = UNSET
    agent: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=64,
            description="The coding agent: mock (built in, for trying this out), claude, codex, opencode or pi "
            "(listAgentSessions says which are installed in the sandbox).",
        ),
    ] = "mock"
    agent_mode: (
        Annotated[
            _Option,
            Meta(
                description="The agent's mode (ACP session mode): mock normal, plan or bypass; claude default, "
                "acceptEdits, plan, dontAsk or bypassPermissions; codex read-only, auto or full-access; opencode "
                "build or plan. Default: the agent's own."
            ),
        ]
        | UnsetType
    ) = UNSET
    permission_mode: (
        Annotated[
            _Option,
            Meta(
                description="A mode that says how the agent asks before acting, set after agentMode: 'bypass' "
                "(mock), 'bypassPermissions' (claude) or 'full-access' (codex) let it act without asking. Default: "
                "it asks, and each request waits for replyAgentPermission."
            ),
        ]
        | UnsetType
    ) = UNSET
    model: Annotated[_Option, Meta(description="The model the agent uses (default: the agent's).")] | UnsetType = UNSET
    directory: (
        Annotated[
            str, Meta(min_length=1, max_length=4096, description="The agent's working directory (default: /home/user).")
        ]
        | UnsetType
    ) = UNSET
    env: Annotated[
        EnvVars,
        Meta(
            description="Environment variables of the agent's process only, e.g. ANTHROPIC_API_KEY or a model "
            "base URL; never written to the event log."
        ),
    ] = {}
    permission_timeout_ms: Annotated[
        int,
        Meta(
            ge=1_000,
            le=86_400_000,
            description="How long a permission request waits for replyAgentPermission before permissionDefault "
            "applies (milliseconds).",
        ),
    ] = 300_000
    permission_default: Annotated[
        Literal["reject", "once"], Meta(description="The answer to a permission request nobody answered in time.")
    ] = "reject"


class PromptAgentSession(ToolArgs):
    sandbox_id: _SandboxId
    session_id: _SessionId
    message: Annotated[str, Meta(min_length=1, description="The task or message for the agent.")]


class GetAgentSessionEvents(ToolArgs):
    sandbox_id: _SandboxId
    session_id: _SessionId
    offset: Annotated[
        int, Meta(ge=0, description="Return the events after this many (the nextOffset of the previous call).")
    ] = 0
    limit: Annotated[int, Meta(ge=1, le=MAX_EVENTS_PAGE, description="At most this many events.")] = 200
    wait_seconds: Annotated[
        float,
        Meta(
            ge=0,
            le=MAX_WAIT_SECONDS,
            description="While a turn runs, wait up to this long for it to end or to ask for a permission before "
            "answering; 0 answers at once.",
        ),
    ] = 30


class ReplyAgentPermission(ToolArgs):
    sandbox_id: _SandboxId
    session_id: _SessionId
    permission_id: Annotated[
        str, Meta(min_length=1, max_length=128, description="The permissionId of the permission.requested event.")
    ]
    reply: Annotated[
        Literal["once", "always", "reject"],
        Meta(description="once: allow this call; always: allow it and the like from now on; reject: refuse it."),
    ]


class ListAgentSessions(ToolArgs):
    sandbox_id: _SandboxId


class TerminateAgentSession(ToolArgs):
    sandbox_id: _SandboxId
    session_id: _SessionId


class RunCommand(ToolArgs):
    command: Annotated[str, Meta(min_length=1, description="A bash command line, run with `bash -l -c`.")]
    cwd: Annotated[str, Meta(description="Working directory (default: the template's, /home/user).")] = ""
    envs: Annotated[EnvVars, Meta(description="Extra environment variables for this command.")] = {}
    timeout: (
        Annotated[
            float,
            Meta(
                gt=0,
                le=MAX_TIMEOUT,
                description="Seconds before the command is killed. Default: 60 in the foreground; "
                "none in the background (it runs as long as the sandbox).",
            ),
        ]
        | UnsetType
    ) = UNSET
    background: Annotated[
        bool, Meta(description="Start it and return its pid at once (for servers); its output is discarded.")
    ] = False


class ReadFile(ToolArgs):
    path: Annotated[str, Meta(min_length=1, description="Absolute, or relative to /home/user.")]


class WriteFile(ToolArgs):
    path: Annotated[str, Meta(min_length=1, description="Absolute, or relative to /home/user; parents are created.")]
    content: Annotated[str, Meta(description="The whole new content of the file.")]
    encoding: Annotated[
        Literal["utf-8", "base64"], Meta(description="How `content` is encoded: text, or base64 for binary data.")
    ] = "utf-8"


class ListFiles(ToolArgs):
    path: Annotated[str, Meta(description="Directory to list (default: /home/user).")] = ""
    depth: Annotated[int, Meta(ge=1, le=10, description="How many levels deep to list.")] = 1


class GetUrl(ToolArgs):
    port: Annotated[int, Meta(ge=1, le=65535, description="The port a server in the sandbox listens on.")]


class RunCode(ToolArgs):
    code: Annotated[str, Meta(min_length=1, description="The code to run, as in a notebook cell.")]
    language: Annotated[
        str, Meta(description="python (default), javascript, typescript, r, java or bash; state is kept per language.")
    ] = "python"
    timeout: Annotated[float, Meta(gt=0, le=3600, description="Seconds before the run is abandoned.")] = 60


class Screenshot(ToolArgs):
    pass


class Click(ToolArgs):
    x: Annotated[int, Meta(ge=0, le=16384, description="Pixels from the screen's left edge.")]
    y: Annotated[int, Meta(ge=0, le=16384, description="Pixels from the screen's top edge.")]
    button: Annotated[Literal["left", "middle", "right"], Meta(description="The mouse button.")] = "left"
    double: Annotated[bool, Meta(description="A double click.")] = False


class TypeText(ToolArgs):
    text: Annotated[str, Meta(min_length=1, max_length=10_000, description="The text to type, as keystrokes.")]


class Press(ToolArgs):
    keys: Annotated[
        list[Annotated[str, Meta(pattern=r"^[A-Za-z0-9_]{1,32}$")]],
        Meta(min_length=1, max_length=8, description='Keys pressed together, e.g. ["ctrl", "c"] or ["enter"].'),
    ]


class Scroll(ToolArgs):
    direction: Annotated[Literal["up", "down"], Meta(description="Which way to scroll.")] = "down"
    amount: Annotated[int, Meta(ge=1, le=100, description="How many wheel steps.")] = 3


class OpenUrl(ToolArgs):
    url: Annotated[str, Meta(min_length=1, max_length=8192, description="A URL or a file path to open.")]


class Navigate(ToolArgs):
    url: Annotated[str, Meta(min_length=1, max_length=8192, description="The URL to load.")]


class Evaluate(ToolArgs):
    expression: Annotated[str, Meta(min_length=1, max_length=100_000, description="A JavaScript expression.")]


class PageText(ToolArgs):
    pass


class PageScreenshot(ToolArgs):
    pass


DesktopToolArgs = Screenshot | Click | TypeText | Press | Scroll | OpenUrl
BrowserToolArgs = Navigate | Evaluate | PageText | PageScreenshot
SandboxToolArgs = RunCommand | ReadFile | WriteFile | ListFiles | GetUrl | RunCode | DesktopToolArgs | BrowserToolArgs

A = TypeVar("A", bound=ToolArgs)


def input_schema(args: type[ToolArgs]) -> dict[str, Any]:
    """The JSON schema of `args`, inline: the tool's description says what the struct's docstring would."""
    (_,), components = msgspec.json.schema_components([args], ref_template="#/$defs/{name}")
    schema: dict[str, Any] = components.pop(args.__name__)
    schema.pop("title", None)
    schema.pop("description", None)
    if components:
        schema["$defs"] = components
    return schema


def parse(args: type[A], arguments: Mapping[str, Any] | None, tool: str) -> A:
    """`arguments` validated and converted, or BadArguments that says what is wrong and shows the schema."""
    try:
        return msgspec.convert(arguments or {}, args)
    except msgspec.ValidationError as exc:
        schema = msgspec.json.encode(input_schema(args)).decode()
        raise BadArguments(f"invalid arguments for {tool}: {exc}. Its input schema: {schema}") from exc
