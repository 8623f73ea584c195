"""Python and bash contexts: one Jupyter kernel each (ipykernel, bash_kernel), driven with jupyter-client.

Kernels talk ZeroMQ over ipc sockets in the service's runtime directory, so they take no TCP port a user
might want. An execution is the kernel's own `execute_request`; its IOPub messages become lines as they
arrive (`_iopub`). While waiting, the backend polls for a stop request and for the kernel's death, so that
a client that left or a time limit interrupts the kernel within `POLL_SECONDS`, and a kernel that died is
restarted (with an `error` line saying so) instead of leaving the execution hanging.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import signal
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from executor.interpreter._backend import (
    INTERRUPT_GRACE_SECONDS,
    BackendFailed,
    Emit,
    died,
    restart_after,
    unresponsive,
)
from executor.interpreter._envcode import restore_env_code, set_env_code
from executor.interpreter._iopub import is_idle, line_from_message

__all__ = ("JupyterBackend",)

logger = logging.getLogger("interpreter")

POLL_SECONDS = 0.2
START_TIMEOUT = 60.0
REPLY_TIMEOUT = 10.0


class JupyterBackend:
    """A context's Jupyter kernel: `kernel_name` is a spec in `specs` (see `_kernelspecs`)."""

    def __init__(
        self, language: str, kernel_name: str, cwd: str, env: Mapping[str, str], runtime: Path, specs: Any
    ) -> None:
        self._language = language
        self._cwd = cwd
        self._env = dict(env)
        name = f"kernel-{uuid.uuid4().hex[:12]}"
        self._manager: Any = AsyncKernelManager(
            kernel_name=kernel_name,
            kernel_spec_manager=specs,
            connection_file=str(runtime / f"{name}.json"),
            transport="ipc",
            ip=str(runtime / name),
        )
        self._client: Any = None

    async def start(self) -> None:
        try:
            await self._manager.start_kernel(cwd=self._cwd, env=self._env)
        except Exception as exc:  # jupyter-client raises whatever its launcher hit
            raise BackendFailed(f"cannot start the {self._language} kernel: {exc}") from exc
        await self._connect()

    async def restart(self) -> None:
        self._disconnect()
        try:
            await self._manager.restart_kernel(now=True)
        except Exception as exc:
            raise BackendFailed(f"cannot restart the {self._language} kernel: {exc}") from exc
        await self._connect()

    async def close(self) -> None:
        self._disconnect()
        if self._manager.has_kernel:
            await self._manager.shutdown_kernel(now=True)

    async def run(self, code: str, env: Mapping[str, str], emit: Emit, stop: asyncio.Event) -> None:
        if self._client is None:  # an earlier restart failed: try again rather than stay broken
            await self.restart()
        if env:
            await self._silent(set_env_code(self._language, env))
        msg_id = self._client.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        if await self._pump(msg_id, emit, stop):
            await self._reply(msg_id)
            if env:
                await self._silent(restore_env_code(self._language, env))

    async def _pump(self, msg_id: str, emit: Emit, stop: asyncio.Event) -> bool:
        """Emit the execution's output until the kernel is idle: True, or restarted: False."""
        loop = asyncio.get_running_loop()
        interrupted_at: float | None = None
        while True:
            if stop.is_set() and interrupted_at is None:
                interrupted_at = loop.time()
                await self._manager.interrupt_kernel()
            try:
                message = await self._client.get_iopub_msg(timeout=POLL_SECONDS)
            except queue.Empty:
                exit_status = await self._manager.provisioner.poll() if self._manager.provisioner else 0
                if exit_status is not None:
                    await restart_after(self, emit, died(f"{self._language} kernel", _describe_exit(exit_status)))
                    return False
                if interrupted_at is not None and loop.time() - interrupted_at > INTERRUPT_GRACE_SECONDS:
                    await restart_after(self, emit, unresponsive(f"{self._language} kernel"))
                    return False
                continue
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue  # left over from an earlier request (a silent one, or one cut short)
            if is_idle(message):
                return True
            line = line_from_message(message)
            if line is not None:
                emit(line)

    async def _silent(self, code: str) -> None:
        """Run helper code that produces no output and leaves no history (environment variables)."""
        msg_id = self._client.execute(code, silent=True, store_history=False, allow_stdin=False)
        await self._reply(msg_id)

    async def _reply(self, msg_id: str) -> None:
        """Read the shell channel up to this request's reply, so that replies never pile up unread."""
        try:
            async with asyncio.timeout(REPLY_TIMEOUT):
                while (await self._client.get_shell_msg()).get("parent_header", {}).get("msg_id") != msg_id:
                    pass
        except TimeoutError:
            logger.warning("%s kernel: no reply to %s within %g s", self._language, msg_id, REPLY_TIMEOUT)

    async def _connect(self) -> None:
        client = self._manager.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=START_TIMEOUT)
        except Exception as exc:  # RuntimeError when the kernel died, TimeoutError when it hangs
            client.stop_channels()
            await self._manager.shutdown_kernel(now=True)
            raise BackendFailed(f"the {self._language} kernel did not come up: {exc}") from exc
        self._client = client

    def _disconnect(self) -> None:
        if self._client is not None:
            self._client.stop_channels()
            self._client = None


def _describe_exit(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"
