"""The agents the server knows: how each is started over ACP, installed from npm, and described.

An agent is installed when its ACP adapter (and the CLI it drives, where it needs one) resolves on
the search path: `<agents dir>/<id>/bin` (`/opt/agents` unless `--agents-dir`), where `install` puts npm
packages, then the sandbox's PATH.
Versions are pinned (coding-agents.md §7.1, the versions measured offline). Amp and Cursor are listed
with the reason they cannot run here. `mock` is builtin: `mock.py` run by the executor's own Python.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass, field

from executor.agent_api import AgentCapabilities, AgentInfo, ConfigOption, ConfigOptionValue

__all__ = ("AGENTS", "AGENTS_DIR", "QUIET_ENV", "AgentKind", "describe", "resolve", "search_path")

AGENTS_DIR = "/opt/agents"
MOCK_PATH = os.path.join(os.path.dirname(__file__), "mock.py")
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
}
"""Every agent starts without telemetry, update checks or model-list fetches (none of them is the user's work)."""


def _caps(flags: str) -> AgentCapabilities:
    """Capabilities from 18 '0'/'1' flags in `AgentCapabilities` field order (as upstream reports them)."""
    names = AgentCapabilities.__struct_fields__
    return AgentCapabilities(**{name: flag == "1" for name, flag in zip(names, flags, strict=True)})


def _select(option_id: str, category: str, current: str, *values: str) -> ConfigOption:
    options = [ConfigOptionValue(value, _title(value)) for value in values]
    return ConfigOption(option_id, option_id.replace("_", " ").title(), category, current, options)  # type: ignore[arg-type]


def _title(value: str) -> str:
    """A value's display name: "acceptEdits" → "Accept Edits", "read-only" → "Read Only"."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", value).replace("-", " ").title()


@dataclass(frozen=True)
class AgentKind:
    """One agent: `adapter` is the argv of its ACP server; `requires` the commands that must resolve."""

    id: str
    adapter: tuple[str, ...]
    capabilities: AgentCapabilities
    config_options: tuple[ConfigOption, ...]
    packages: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    credentials: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    unavailable: str | None = None
    version: str | None = None

    @property
    def commands(self) -> tuple[str, ...]:
        return (self.adapter[0], *self.requires)


AGENTS: dict[str, AgentKind] = {
    kind.id: kind
    for kind in (
        AgentKind(
            "claude",
            ("claude-agent-acp",),
            _caps("011111000000001100"),
            (
                _select("model", "model", "default", "default", "sonnet", "opus", "haiku"),
                _select("mode", "mode", "default", "default", "acceptEdits", "plan", "dontAsk", "bypassPermissions"),
            ),
            packages=("@zed-industries/claude-agent-acp@0.23.1",),
            credentials=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
            version="0.23.1",
        ),
        AgentKind(
            "codex",
            ("codex-acp",),
            _caps("110111111111111110"),
            (_select("mode", "mode", "read-only", "read-only", "auto", "full-access"),),
            packages=("@zed-industries/codex-acp@0.16.0",),
            credentials=("OPENAI_API_KEY", "CODEX_API_KEY"),
            version="0.16.0",
        ),
        AgentKind(
            "opencode",
            ("opencode", "acp"),
            _caps("000111111100001110"),
            (_select("mode", "mode", "build", "build", "plan"),),
            packages=("opencode-ai@1.18.33",),
            credentials=("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "OPENCODE_API_KEY"),
            version="1.18.33",
        ),
        AgentKind(
            "pi",
            ("pi-acp",),
            _caps("000111101100000110"),
            (_select("model", "model", "default", "default"),),
            packages=("pi-acp@0.0.34", "@earendil-works/pi-coding-agent@1.6.0"),
            requires=("pi",),
            credentials=("OPENAI_API_KEY", "ANTHROPIC_API_KEY"),
            version="1.6.0",
        ),
        AgentKind(
            "amp",
            ("amp-acp",),
            _caps("000111000100001000"),
            (_select("mode", "mode", "default", "default", "bypass"),),
            credentials=("AMP_API_KEY",),
            unavailable="Amp runs only against the Amp service (ampcode.com), never a model endpoint you choose",
        ),
        AgentKind(
            "cursor",
            ("cursor-agent-acp",),
            _caps("110111101100000110"),
            (),
            credentials=("CURSOR_API_KEY",),
            unavailable="Cursor's agent CLI is not published on npm, so there is no pinned package to install",
        ),
        AgentKind(
            "mock",
            (sys.executable, "-I", "-S", MOCK_PATH),
            _caps("111111111111111110"),
            (_select("mode", "mode", "normal", "normal", "plan", "bypass"),),
            version="builtin",
        ),
    )
}


def search_path(agents_dir: str, path_env: str, agent: str) -> str:
    """Where an agent's commands are looked for: its install directory first, then the sandbox's PATH."""
    return os.pathsep.join([os.path.join(agents_dir, agent, "bin"), path_env])


def resolve(kind: AgentKind, path: str) -> list[str] | None:
    """The adapter's argv with its command made absolute (looked for on `path`), or None when one is missing."""
    if kind.id == "mock":
        return list(kind.adapter)
    if kind.unavailable is not None:
        return None
    found = [shutil.which(command, path=path) for command in kind.commands]
    if None in found:
        return None
    return [str(found[0]), *kind.adapter[1:]]


def describe(kind: AgentKind, agents_dir: str, path_env: str, env: dict[str, str], with_config: bool) -> AgentInfo:
    """The `AgentInfo` of one agent now."""
    argv = resolve(kind, search_path(agents_dir, path_env, kind.id))
    installed = argv is not None
    reason = kind.unavailable
    if not installed and reason is None:
        where = os.path.join(agents_dir, kind.id)
        reason = f"not installed: POST /v1/agents/{kind.id}/install puts {' '.join(kind.packages)} in {where}"
    return AgentInfo(
        id=kind.id,
        installed=installed,
        credentials_available=kind.id == "mock" or any(env.get(name) for name in kind.credentials),
        capabilities=kind.capabilities,
        version=kind.version if installed else None,
        path=argv[-1] if kind.id == "mock" and argv else (argv[0] if argv else None),
        config_options=list(kind.config_options) if with_config else None,
        reason=reason,
    )
