"""Where sandboxes come from: templates, their images, and the runtimes that run them."""

from pool._errors import ImageBuildError, PoolError, PortClosed, RuntimeFailure, SandboxGone
from pool._executor_client import post_init
from pool._local import LocalRuntime, LocalRuntimeSettings
from pool._local._images import ImageStore
from pool._runtime import ExecutorInit, Runtime, SandboxSpec, SandboxStats
from pool._templates import Resources, Template, TemplateError, load_templates

__all__ = [
    "ExecutorInit",
    "ImageBuildError",
    "ImageStore",
    "LocalRuntime",
    "LocalRuntimeSettings",
    "PoolError",
    "PortClosed",
    "Resources",
    "Runtime",
    "RuntimeFailure",
    "SandboxGone",
    "SandboxSpec",
    "SandboxStats",
    "Template",
    "TemplateError",
    "load_templates",
    "post_init",
]
