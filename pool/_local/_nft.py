"""nftables for sandboxes, applied through a worker process (`_nft_worker`) rather than in the server.

libnftables (the library the `nft` tool fronts; no `nft` process per sandbox, and the tool is not even
installed on these hosts) waits on its netlink socket with select(), whose fd_set only holds descriptors below
1024: glibc aborts the whole process past that ("bit out of range 0 - FD_SETSIZE on fd_set"). The server holds
thousands of connections under a burst of held requests, so the library runs in a small child process with a
handful of descriptors, started on first use and again if it ever dies. A call hands it the calling thread's
network namespace and the commands over a Unix socket; a round trip costs about as much as the table itself
(~1 ms).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from pool._errors import RuntimeFailure

__all__ = ["run_nft"]

_WORKER = Path(__file__).with_name("_nft_worker.py")
_ANSWER_BYTES = 64 * 1024


class _Worker:
    """The worker process and the server's end of its socket; one request at a time (`lock`)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_WORKER), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.sock = ours

    def call(self, commands: bytes, netns_fd: int) -> bytes:
        socket.send_fds(self.sock, [commands], [netns_fd])
        answer = self.sock.recv(_ANSWER_BYTES)
        if not answer:
            raise OSError("the nftables worker exited")
        return answer

    def close(self) -> None:
        self.sock.close()
        self.process.kill()
        self.process.wait()


_lock = threading.Lock()  # guards `_workers` and serializes requests: the worker answers one at a time
_workers: list[_Worker] = []


def run_nft(commands: str) -> None:
    """Apply `commands` (nft syntax, one transaction: all or nothing) in the calling thread's network namespace."""
    netns_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        answer = _call(commands.encode(), netns_fd)
    finally:
        os.close(netns_fd)
    if answer != b"\0":
        raise RuntimeFailure(f"nftables refused the sandbox's rules: {answer[1:].decode(errors='replace')}")


def _call(commands: bytes, netns_fd: int) -> bytes:
    with _lock:
        for _attempt in range(2):  # a worker that died (or was killed) is replaced once
            if not _workers:
                try:
                    _workers.append(_Worker())
                except OSError as exc:
                    raise RuntimeFailure(f"the nftables worker did not start: {exc}") from exc
            try:
                return _workers[0].call(commands, netns_fd)
            except OSError as exc:
                _workers.pop().close()
                failure = exc
        raise RuntimeFailure(f"the nftables worker failed: {failure}") from failure


def _close_worker_in_children() -> None:
    """A forked child must not share the parent's worker: it starts its own if it needs one."""
    _workers.clear()


os.register_at_fork(after_in_child=_close_worker_in_children)
