"""What each real agent needs in its HOME to run offline against the scripted model, as a template would hold it.

`config_files(agent, model)` gives the files (paths relative to HOME) that point Codex, OpenCode and Pi at a
scripted model server's base URL (coding-agents.md §7.2; Claude takes its endpoint from `ANTHROPIC_BASE_URL`
alone). Pi never asks before a tool runs, so its files include an extension that does (pi-acp forwards the
question as a permission request). `write_config` writes them under a host directory; the in-sandbox tests
write the same files with the E2B SDK.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ("API_KEY", "SESSION_ENV", "TURNS", "Turn", "config_files", "write_config")

API_KEY = "sk-scripted-test"
SESSION_ENV = {
    "SCRIPTED_API_KEY": API_KEY,
    "OPENAI_API_KEY": API_KEY,
    "ANTHROPIC_API_KEY": API_KEY,
}
"""The credentials a session gives its agent (Codex reads `SCRIPTED_API_KEY`, the model provider's `env_key`)."""


def _codex(model: str) -> dict[str, str]:
    config = f"""model = "scripted"
model_provider = "scripted"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.scripted]
name = "Scripted"
base_url = "{model}/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"

[analytics]
enabled = false
"""
    return {".codex/config.toml": config}


def _opencode(model: str) -> dict[str, str]:
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "scripted": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Scripted",
                "options": {"baseURL": f"{model}/v1", "apiKey": API_KEY},
                "models": {"scripted": {"name": "Scripted", "tool_call": True}},
            }
        },
        "model": "scripted/scripted",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "ask", "edit": "ask"},
    }
    return {".config/opencode/opencode.json": json.dumps(config, indent=2)}


PI_CONFIRM_EXTENSION = """\
// Ask before every bash command (Pi itself never asks; pi-acp forwards the question as a permission request).
export default function (pi: any) {
  pi.on("tool_call", async (event: any, ctx: any) => {
    if (event.toolName !== "bash") return undefined;
    const allowed = await ctx.ui.confirm("Run this command?", String(event.input.command));
    return allowed ? undefined : { block: true, reason: "The user refused to run the command" };
  });
}
"""


def _pi(model: str) -> dict[str, str]:
    provider = {
        "baseUrl": f"{model}/v1",
        "api": "openai-completions",
        "apiKey": API_KEY,
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "scripted", "name": "Scripted"}],
    }
    return {
        ".pi/agent/models.json": json.dumps({"providers": {"scripted": provider}}, indent=2),
        ".pi/agent/settings.json": json.dumps({"defaultProvider": "scripted", "defaultModel": "scripted"}),
        ".pi/agent/extensions/confirm-bash.ts": PI_CONFIRM_EXTENSION,
    }


_FILES = {"claude": lambda model: {}, "codex": _codex, "opencode": _opencode, "pi": _pi}


def config_files(agent: str, model: str) -> dict[str, str]:
    """The files (relative to HOME) that point `agent` at the scripted model at base URL `model`."""
    files: dict[str, str] = _FILES[agent](model)
    return files


def write_config(home: Path, agent: str, model: str) -> None:
    for relative, text in config_files(agent, model).items():
        (home / relative).parent.mkdir(parents=True, exist_ok=True)
        (home / relative).write_text(text)


@dataclass(frozen=True)
class Turn:
    """How an agent is asked to run the scripted command so that it asks for permission first."""

    prompt: str = "Create hello.txt please"
    session: dict[str, Any] = field(default_factory=dict)
    """What the session is created with, besides the agent and its directory."""
    refused_phase: str = "completed"
    """How the turn ends when the tool call is refused: the agent tells the model, or ends the turn."""


TURNS = {
    "claude": Turn(),
    "codex": Turn(  # read-only, and the model asks to escalate: Codex asks before it runs the command
        "Create hello.txt please [[escalate]]",
        {"agentMode": "read-only"},
        "cancelled",  # Codex's `abort` interrupts the turn: the model is not asked again
    ),
    "opencode": Turn(),  # its config says `permission: ask`
    "pi": Turn(),  # its extension asks
}
