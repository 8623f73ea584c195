"""The `local` runtime: sandboxes as isolated process trees on this machine."""

from pool._local._cgroups import HostCeiling, set_sandboxes_ceiling
from pool._local._egress import EgressSettings
from pool._local._runtime import LocalRuntime, LocalRuntimeSettings

__all__ = ["EgressSettings", "HostCeiling", "LocalRuntime", "LocalRuntimeSettings", "set_sandboxes_ceiling"]
