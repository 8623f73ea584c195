"""A sandbox's own autostart command (`pool._autostart`) across files-only snapshots (CRIU turned off).

The command is declared in `~/.config/agent-sandbox/autostart.json`; started with `AGENT_SANDBOX_AUTOSTART=1`
(as `agent-sandbox deploy` starts it) its processes count as the sandbox's own, and a restore from files starts
it again and waits for its ports.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from pool import AUTOSTART_ENV, AUTOSTART_FILE, ExecutorInit, LocalRuntime, SandboxSpec
from tests.runtime_fixtures import TEMPLATES, http_get, local_runtime
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

_TOKEN = "autostart-token"
_PORT = 8100
# Counts its runs in a file, then serves the home directory (slowly: the restore must wait for the port).
_COMMAND = f"echo run >> ~/runs; sleep 0.3; exec python3 -m http.server {_PORT} --bind 127.0.0.1 --directory ~"


def _spec(sandbox_id: str) -> SandboxSpec:
    init = ExecutorInit(access_token=_TOKEN, default_user="user")
    return SandboxSpec(sandbox_id=sandbox_id, template=TEMPLATES["base"], init=init)


async def _sh(rt: LocalRuntime, sandbox_id: str, command: str) -> str:
    result = await run_in_sandbox(rt, sandbox_id, command, token=_TOKEN)
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def _declare(rt: LocalRuntime, sandbox_id: str, content: str) -> None:
    await _sh(
        rt, sandbox_id, f"mkdir -p ~/.config/agent-sandbox && printf %s {shlex.quote(content)} > ~/{AUTOSTART_FILE}"
    )


async def _start_detached(rt: LocalRuntime, sandbox_id: str, command: str, env: str = "") -> None:
    """Start `command` as its own session (so only a mark can make it the sandbox's), then wait for the port."""
    await _sh(rt, sandbox_id, f"({env} setsid bash -c {shlex.quote(command)} </dev/null >/dev/null 2>&1 &)")
    await _sh(
        rt,
        sandbox_id,
        f"for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/{_PORT}) 2>/dev/null && exit; sleep 0.05; done; exit 1",
    )


async def _run(tmp_path: Path, scenario: Callable[[LocalRuntime], Awaitable[None]]) -> None:
    async with local_runtime(tmp_path, criu=False) as rt:
        await scenario(rt)


async def test_a_restore_from_files_starts_the_autostart_command_and_waits_for_its_port(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(_spec("auto"))
        await _declare(rt, "auto", json.dumps({"command": _COMMAND, "ports": [_PORT]}))
        await _start_detached(rt, "auto", _COMMAND, env=f"{AUTOSTART_ENV}=1")
        assert rt.snapshot_keeps_processes("auto")  # the marked server is the sandbox's own: a restore restarts it
        assert (await rt.snapshot("auto")).kind == "filesystem"
        await rt.restore(_spec("auto"))
        assert await http_get(rt, "auto", _PORT, "/runs") == b"run\nrun\n"  # listening as soon as restore returns
        assert rt.snapshot_keeps_processes("auto")  # started by the restore: still the sandbox's own
        await rt.snapshot("auto")
        await rt.restore(_spec("auto"))
        assert await http_get(rt, "auto", _PORT, "/runs") == b"run\nrun\nrun\n"

    await _run(tmp_path, scenario)


async def test_an_unmarked_server_would_be_lost_so_it_keeps_the_sandbox_from_a_files_only_snapshot(
    tmp_path: Path,
) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(_spec("unmarked"))
        await _declare(rt, "unmarked", json.dumps({"command": _COMMAND, "ports": [_PORT]}))
        await _start_detached(rt, "unmarked", _COMMAND)
        assert not rt.snapshot_keeps_processes("unmarked")

    await _run(tmp_path, scenario)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(None, id="no-file"),
        pytest.param("{not json", id="malformed"),
        pytest.param(json.dumps({"command": "sleep 600", "ports": [_PORT]}), id="port-never-opens"),
    ],
)
async def test_a_missing_or_broken_autostart_does_not_keep_the_sandbox_from_coming_back(
    tmp_path: Path, content: str | None
) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(_spec("broken"))
        if content is not None:
            await _declare(rt, "broken", content)
        await _sh(rt, "broken", "echo kept > ~/note")
        await rt.snapshot("broken")
        await rt.restore(_spec("broken"))
        assert (await _sh(rt, "broken", "cat ~/note")) == "kept\n"

    async with local_runtime(tmp_path, criu=False, ports_timeout=1.0) as rt:
        await scenario(rt)
