"""The `local` runtime: sandboxes as isolated process trees on this machine."""

from pool._local._runtime import LocalRuntime, LocalRuntimeSettings

__all__ = ["LocalRuntime", "LocalRuntimeSettings"]
