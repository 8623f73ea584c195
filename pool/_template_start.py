"""Bringing a freshly started executor up to what its template promises: init, start commands, open ports.

Runtime-neutral: it talks to the executor and the template's ports through a `connect(port)` the runtime
provides. Start commands run in the background (their streams are closed at once, the processes live on)
as the template's user, tagged `template-start-<n>`, so a runtime can tell them from the user's processes.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from executor.envd import ENVD_PORT
from pool._errors import PortClosed, RuntimeFailure
from pool._executor_client import post_init, start_process
from pool._runtime import SandboxSpec
from pool._templates import Template

__all__ = ["START_TAG", "Connect", "bring_up", "run_start_commands", "wait_for_ports"]

START_TAG = "template-start-"
Connect = Callable[[int], Awaitable[socket.socket]]
_FIRST_RETRY = 0.005
_LAST_RETRY = 0.1


async def bring_up(connect: Connect, spec: SandboxSpec, *, ports_timeout: float) -> list[int]:
    """Apply `spec.init`, start the template's commands and wait for its ports; return the commands' pids."""
    await post_init(await connect(ENVD_PORT), spec.init, None)
    pids = await run_start_commands(connect, spec)
    await wait_for_ports(connect, spec.template, within=ports_timeout)
    return pids


async def run_start_commands(connect: Connect, spec: SandboxSpec) -> list[int]:
    """Start each of the template's start commands without waiting for it to end; their pids inside."""
    user, token = spec.template.user, spec.init.access_token
    return [
        await start_process(await connect(ENVD_PORT), command, tag=f"{START_TAG}{n}", user=user, token=token)
        for n, command in enumerate(spec.template.start)
    ]


async def wait_for_ports(connect: Connect, template: Template, *, within: float) -> None:
    """Return once every port of the template accepts connections; RuntimeFailure after `within` seconds."""
    port = 0
    try:
        async with asyncio.timeout(within):
            for port in template.ports:
                await _accepting(connect, port)
    except TimeoutError as exc:
        raise RuntimeFailure(
            f"template {template.name!r}: nothing accepted connections on port {port} within {within:g} s "
            "(does a start command listen on it?)"
        ) from exc


async def _accepting(connect: Connect, port: int) -> None:
    delay = _FIRST_RETRY
    while True:
        try:
            (await connect(port)).close()
            return
        except PortClosed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LAST_RETRY)
