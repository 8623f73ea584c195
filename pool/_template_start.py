"""Bringing a freshly started executor up to what its template promises: init, start commands, open ports.

Runtime-neutral: it talks to the executor and the template's ports through a `connect(port)` the runtime
provides. Start commands run in the background (their streams are closed at once, the processes live on)
as the template's user, tagged `template-start-<n>`, so a runtime can tell them from the user's processes.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from executor.envd import ENVD_PORT, DataEvent
from pool._errors import PortClosed, RuntimeFailure
from pool._executor_client import post_init, run_command, start_process
from pool._runtime import SandboxSpec
from pool._templates import Template

__all__ = ["START_TAG", "Connect", "bring_up", "run_start_commands", "wait_for_ports", "wait_until_ready"]

START_TAG = "template-start-"
Connect = Callable[[int], Awaitable[socket.socket]]
_FIRST_RETRY = 0.005
_LAST_RETRY = 0.1
_READY_RETRY = 1.0
_KEPT_OUTPUT = 4096  # bytes of a ready command's output kept for the error


async def bring_up(connect: Connect, spec: SandboxSpec, *, ports_timeout: float) -> list[int]:
    """Apply `spec.init`, start the template's commands and wait for its ports and its ready command; return the
    commands' pids."""
    await post_init(await connect(ENVD_PORT), spec.init, None)
    pids = await run_start_commands(connect, spec)
    await wait_for_ports(connect, spec.template, within=ports_timeout)
    await wait_until_ready(connect, spec, within=ports_timeout)
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


async def wait_until_ready(connect: Connect, spec: SandboxSpec, *, within: float) -> None:
    """Run the template's ready command until it exits 0 (E2B's readyCmd), first at once, then backing off to
    once a second; RuntimeFailure with its last output after `within` seconds. No ready command: return."""
    ready = spec.template.ready
    if not ready:
        return
    delay, output = _FIRST_RETRY, bytearray()
    try:
        async with asyncio.timeout(within):
            while True:
                output.clear()
                try:
                    if await _succeeds(connect, spec, ready, output, within):
                        return
                except RuntimeFailure as exc:  # one failed attempt (the executor busy starting): try again
                    output[:] = str(exc).encode()[-_KEPT_OUTPUT:]
                await asyncio.sleep(delay)
                delay = min(delay * 2, _READY_RETRY)
    except TimeoutError as exc:
        last = output.decode(errors="replace").strip()[-500:]
        raise RuntimeFailure(
            f"template {spec.template.name!r}: the ready command {ready!r} did not succeed within {within:g} s"
            + (f" (its last output: {last})" if last else "")
        ) from exc


async def _succeeds(connect: Connect, spec: SandboxSpec, command: str, output: bytearray, within: float) -> bool:
    def keep(data: DataEvent) -> None:
        output.extend(data.stdout or data.stderr or b"")
        del output[: max(len(output) - _KEPT_OUTPUT, 0)]

    sock = await connect(ENVD_PORT)
    token = spec.init.access_token
    end = await run_command(sock, command, keep, user=spec.template.user, token=token, time_limit=within)
    return end.exited and end.exit_code == 0


async def _accepting(connect: Connect, port: int) -> None:
    delay = _FIRST_RETRY
    while True:
        try:
            (await connect(port)).close()
            return
        except PortClosed:
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LAST_RETRY)
