"""nftables from the process itself: libnftables (the library the `nft` tool is a front end of) over ctypes.

No `nft` process per sandbox (the tool is not even installed on these hosts): a sandbox's table goes into
the calling thread's network namespace in about 1 ms (the first call in a process pays ~9 ms of library
set-up once). The library is Debian's `libnftables1`, which CRIU's network lock uses too.
"""

from __future__ import annotations

import ctypes
import ctypes.util

from pool._errors import RuntimeFailure

__all__ = ["run_nft"]


class _Library:
    """The few libnftables calls we make, loaded on first use (hosts without it fail when a sandbox starts)."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(ctypes.util.find_library("nftables") or "libnftables.so.1")
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        self.lib = lib


_loaded: _Library | None = None


def run_nft(commands: str) -> None:
    """Apply `commands` (nft syntax, one transaction: all or nothing) in the calling thread's network namespace."""
    global _loaded
    try:
        _loaded = _loaded or _Library()
    except OSError as exc:
        raise RuntimeFailure(f"libnftables is missing (install libnftables1): {exc}") from exc
    lib = _loaded.lib
    ctx = lib.nft_ctx_new(0)
    if not ctx:
        raise RuntimeFailure("libnftables could not create a context")
    try:
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        if lib.nft_run_cmd_from_buffer(ctx, commands.encode()) != 0:
            error = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
            raise RuntimeFailure(f"nftables refused the sandbox's rules: {error.strip()}")
    finally:
        lib.nft_ctx_free(ctx)
