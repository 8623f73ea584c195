"""Starting an agent's ACP process: its command, user, environment and directory, and the secrets to keep out of logs.

The agent runs as the sandbox's default user with envd's environment (the sandbox's env vars from
/init), then the agent's quiet settings, then what the session adds (its model credentials and base
URLs). The agent's install directory stays first on PATH, a session's own PATH after it: an adapter
runs the CLI installed beside it (pi-acp runs `pi`). As root, Claude Code needs `IS_SANDBOX=1`.
Values of variables whose names say they are secrets are replaced in anything logged (the stderr
tail an exit reports).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from executor._agents._catalog import AGENTS, AGENTS_DIR, QUIET_ENV, AgentKind, describe, resolve, search_path
from executor._defaults import Defaults
from executor._process_env import environment, working_directory
from executor._spawn import Spec
from executor._users import lookup
from executor.agent_api import AgentInfo, AgentList

__all__ = ("Launcher", "NotInstalled", "UnknownAgent")

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)
MIN_SECRET_LENGTH = 6


class UnknownAgent(Exception):
    """No agent has this id."""


class NotInstalled(Exception):
    """The agent is known but cannot be started here; the message says why."""


@dataclass
class Launcher:
    """Builds the `Spec` of an agent process from the sandbox's current defaults."""

    defaults: Defaults
    path_env: str
    state_dir: str
    agents_dir: str = AGENTS_DIR

    def search_path(self, agent: str) -> str:
        return search_path(self.agents_dir, self.path_env, agent)

    def kind(self, agent: str) -> AgentKind:
        kind = AGENTS.get(agent)
        if kind is None:
            raise UnknownAgent(f"unsupported agent: {agent}")
        return kind

    def catalog(self, with_config: bool) -> AgentList:
        env = self.defaults.env_vars
        return AgentList([describe(kind, self.agents_dir, self.path_env, env, with_config) for kind in AGENTS.values()])

    def describe(self, kind: AgentKind) -> AgentInfo:
        return describe(kind, self.agents_dir, self.path_env, self.defaults.env_vars, False)

    def spec(self, agent: str, extra_env: dict[str, str], directory: str | None, tag: str) -> Spec:
        kind = self.kind(agent)
        argv = resolve(kind, self.search_path(agent))
        if argv is None:
            raise NotInstalled(self.describe(kind).reason or "not installed")
        user = lookup(self.defaults.user)
        env = environment(self.defaults, self.search_path(agent), user, {})
        env |= QUIET_ENV | kind.env | extra_env
        if "PATH" in extra_env:  # the session's PATH, after the agent's own commands (pi-acp runs `pi` from there)
            env["PATH"] = search_path(self.agents_dir, extra_env["PATH"], agent)
        if user.uid == 0:
            env["IS_SANDBOX"] = "1"
        if kind.id == "mock":
            env["SANDBOX_AGENT_CATALOG"] = self._write_catalog()
        cwd = working_directory(self.defaults, user, directory)
        return Spec(argv=argv, env=env, cwd=cwd, user=user, stdin=True, tag=tag)

    def redactor(self, extra_env: dict[str, str]) -> Callable[[str], str]:
        """A function that blanks the values of the secrets the agent got."""
        env = self.defaults.env_vars | extra_env
        secrets = sorted(
            (value for name, value in env.items() if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_LENGTH),
            key=len,
            reverse=True,
        )

        def redact(text: str) -> str:
            for secret in secrets:
                text = text.replace(secret, "[redacted]")
            return text

        return redact

    def _write_catalog(self) -> str:
        """The agent list the mock answers `_sandboxagent/agent/list` with (the CLI's `api agents list`)."""
        path = os.path.join(self.state_dir, "agents.json")
        with open(path, "wb") as file:
            file.write(msgspec.json.encode(self.catalog(with_config=False)))
        return path
