"""libnftables over ctypes, and the worker process the server applies every sandbox's table through.

Run as `python3 -I -S _nft_worker.py FD`: FD is a SOCK_SEQPACKET Unix socket. Each request is one message,
the nft commands, with the target network namespace attached (SCM_RIGHTS); the worker enters that namespace,
applies the commands as one transaction and answers b"\\0", or b"\\1" and libnftables' error. It exits when
the socket closes. It imports the standard library only, so it starts in ~20 ms without the server's packages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import sys

__all__ = ["NftError", "apply_here"]

_CLONE_NEWNET = 0x40000000
_MAX_REQUEST = 1 << 20  # a sandbox's table is a few KiB


class NftError(Exception):
    """libnftables refused the commands, or could not be loaded; the message says which."""


class _Library:
    """The few libnftables calls we make, loaded on first use."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("nftables") or "libnftables.so.1")
        except OSError as exc:
            raise NftError(f"libnftables is missing (install libnftables1): {exc}") from exc
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self.lib = lib


_loaded: list[_Library] = []


def apply_here(commands: str) -> None:
    """Apply `commands` (one transaction: all or nothing) in the calling thread's network namespace.

    Only for a process with few descriptors: libnftables waits on its netlink socket with select(), and glibc
    aborts the process when that socket's descriptor is 1024 or more. The server uses `_nft.run_nft` instead.
    """
    if not _loaded:
        _loaded.append(_Library())
    lib = _loaded[0].lib
    ctx = lib.nft_ctx_new(0)
    if not ctx:
        raise NftError("libnftables could not create a context")
    try:
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        if lib.nft_run_cmd_from_buffer(ctx, commands.encode()) != 0:
            raise NftError((lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace").strip())
    finally:
        lib.nft_ctx_free(ctx)


def _entered(libc: ctypes.CDLL, netns_fd: int) -> bool:
    """Whether this process is in the namespace of `netns_fd`, after a setns() where it was not. Checked first:
    a pod's egress guard, already there, holds no CAP_SYS_ADMIN, which setns() takes even into the same one."""
    target, here = os.fstat(netns_fd), os.stat("/proc/thread-self/ns/net")
    if (target.st_dev, target.st_ino) == (here.st_dev, here.st_ino):
        return True
    return bool(libc.setns(netns_fd, _CLONE_NEWNET) == 0)


def _serve(sock: socket.socket) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    while True:
        commands, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 1)
        if not commands:
            return  # the server closed its end
        try:
            if len(fds) != 1 or not _entered(libc, fds[0]):
                raise NftError(f"cannot enter the sandbox's network namespace: {os.strerror(ctypes.get_errno())}")
            apply_here(commands.decode())
            answer = b"\0"
        except NftError as exc:
            answer = b"\1" + str(exc).encode()
        finally:
            for fd in fds:
                os.close(fd)
        sock.send(answer)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
