"""The wire between the `sudo` command (`executor/sudo.py`) and the executor's sudo server (`_sudo`), defined once.

Standard library only: the command imports it on every `sudo`, without the executor's libraries.

    socket   SOCK_SEQPACKET, abstract name `SOCKET`, in the sandbox's own network namespace
    request  one message: JSON {"argv": [...], "user": "root", "env": {...}, "cwd": "/..."} (at most
             MAX_REQUEST bytes) with the caller's stdin, stdout and stderr attached (SCM_RIGHTS)
    then     the command → server: one message per signal to pass on, its number as one byte
    answer   server → command, then close: `EXITED` + STATUS (the exit status as a shell reports it:
             the code, or 128 + the signal), or `REFUSED` + a UTF-8 message for stderr (status 1)
"""

from __future__ import annotations

import struct

__all__ = ("EXITED", "MAX_REQUEST", "REFUSED", "SOCKET", "STATUS")

SOCKET = b"\0agent-sandbox/sudo"
MAX_REQUEST = 128 * 1024  # fits one SEQPACKET message with the default socket buffers
STATUS = struct.Struct(">i")
EXITED = b"x"
REFUSED = b"!"
