"""A sandbox's own start command, kept in its files: what a files-only restore starts again besides the template's.

Without CRIU a snapshot keeps only files, so a server the user started inside (a deployed site) would be gone
after a restore. A sandbox may therefore declare one command in `~/.config/agent-sandbox/autostart.json` (in
the home of the template's user): `{"command": "...", "ports": [8080]}`. After a files-only restore the
runtime runs it with `bash -l -c` as the template's user, tagged `agent-sandbox-autostart`, with
`AGENT_SANDBOX_AUTOSTART=1` in its environment, and waits for its ports like the template's, so the request
that woke the sandbox finds the server listening. Whoever starts the command while the sandbox runs (e.g.
`agent-sandbox deploy`) sets the same variable: the runtime's census counts such processes as the sandbox's
own, which lets the idle policy snapshot the sandbox without CRIU. A missing file means no autostart; a
malformed one, or ports that never open, are logged and the restore goes on (traffic then gets the
gateway's "port is not open").
"""

from __future__ import annotations

import logging
from typing import Annotated

import msgspec

from executor.envd import ENVD_PORT
from pool._errors import RuntimeFailure
from pool._executor_client import read_file, start_process
from pool._runtime import SandboxSpec
from pool._template_start import Connect, wait_for_ports

__all__ = ["AUTOSTART_ENV", "AUTOSTART_FILE", "AUTOSTART_TAG", "Autostart", "run_autostart"]

AUTOSTART_FILE = ".config/agent-sandbox/autostart.json"  # relative to the template user's home
AUTOSTART_TAG = "agent-sandbox-autostart"
AUTOSTART_ENV = "AGENT_SANDBOX_AUTOSTART"  # set to "1" in the environment of the command and its children
_MAX_FILE_BYTES = 64 * 1024

_log = logging.getLogger("pool.autostart")


class Autostart(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The file's content: a shell command, and the ports it serves on (the restore waits for them)."""

    command: Annotated[str, msgspec.Meta(min_length=1)]
    ports: list[Annotated[int, msgspec.Meta(ge=1, le=65535)]] = []


_decoder = msgspec.json.Decoder(Autostart)


async def run_autostart(connect: Connect, spec: SandboxSpec, *, ports_timeout: float) -> list[int]:
    """Start the sandbox's autostart command, if it has one, and wait for its ports; its pid inside, or none."""
    user, token = spec.template.user, spec.init.access_token
    try:
        raw = await read_file(await connect(ENVD_PORT), AUTOSTART_FILE, user=user, token=token, limit=_MAX_FILE_BYTES)
        if raw is None:
            return []
        autostart = _decoder.decode(raw)
    except (RuntimeFailure, msgspec.DecodeError) as exc:
        _log.warning("sandbox %s: ~/%s ignored: %s", spec.sandbox_id, AUTOSTART_FILE, exc)
        return []
    command = f"export {AUTOSTART_ENV}=1; {autostart.command}"
    pid = await start_process(await connect(ENVD_PORT), command, tag=AUTOSTART_TAG, user=user, token=token)
    template = msgspec.structs.replace(spec.template, ports=tuple(autostart.ports))
    try:
        await wait_for_ports(connect, template, within=ports_timeout)
    except RuntimeFailure as exc:
        _log.warning("sandbox %s: its autostart command does not serve its ports: %s", spec.sandbox_id, exc)
    return [pid]
