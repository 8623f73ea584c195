"""Where sandboxes come from: templates, their images, and the runtimes that run them."""

from pool._errors import ImageBuildError, PoolError, PortClosed, RuntimeFailure, SandboxGone
from pool._executor_client import post_init
from pool._local import LocalRuntime, LocalRuntimeSettings
from pool._local._checks import PlatformCheck, check_platform
from pool._local._criu import DEFAULT_CRIU_DIR
from pool._local._images import ImageStore
from pool._runtime import (
    ExecutorInit,
    Runtime,
    RuntimeCapabilities,
    SandboxSpec,
    SandboxStats,
    SnapshotInfo,
    SnapshotKind,
)
from pool._templates import Resources, Template, TemplateError, load_templates
from pool._warm import WarmPools, WarmPoolStats, WarmRuntime

__all__ = [
    "DEFAULT_CRIU_DIR",
    "ExecutorInit",
    "ImageBuildError",
    "ImageStore",
    "LocalRuntime",
    "LocalRuntimeSettings",
    "PlatformCheck",
    "PoolError",
    "PortClosed",
    "Resources",
    "Runtime",
    "RuntimeCapabilities",
    "RuntimeFailure",
    "SandboxGone",
    "SandboxSpec",
    "SandboxStats",
    "SnapshotInfo",
    "SnapshotKind",
    "Template",
    "TemplateError",
    "WarmPoolStats",
    "WarmPools",
    "WarmRuntime",
    "check_platform",
    "load_templates",
    "post_init",
]
