"""Where sandboxes come from: templates, their images, and the runtimes that run them."""

from pool import _envd as envd  # the executor's client: `envd.EnvdClient`, its transports and Connect framing
from pool._autostart import AUTOSTART_ENV, AUTOSTART_FILE, AUTOSTART_TAG, Autostart
from pool._envd import (
    ENVD_PORT,
    BodyReader,
    EnvdClient,
    EnvdTransport,
    KeptAliveTransport,
    Reply,
    SocketOpener,
    SocketTransport,
    shell_command,
)
from pool._errors import (
    ExecutorError,
    ExecutorRefused,
    ImageBuildError,
    PoolError,
    PortClosed,
    RuntimeFailure,
    SandboxGone,
)
from pool._executor_client import post_init
from pool._kube import Connection as KubeConnection  # outside the kube package `Connection` alone says too little
from pool._kube import (
    KubeApi,
    KubeApiError,
    KubernetesRuntime,
    KubeSettings,
    KubeWarmPools,
    LeaderElection,
    open_kube_runtime,
    while_leading,
)
from pool._kube import _shapes as kube_shapes  # the Kubernetes objects' names, labels, annotations and Secrets
from pool._local import EgressSettings, LocalRuntime, LocalRuntimeSettings
from pool._local._checks import PlatformCheck, check_platform
from pool._local._criu import DEFAULT_CRIU_DIR
from pool._local._images import ImageStore
from pool._runtime import (
    ALL_TRAFFIC,
    EgressRules,
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
    "ALL_TRAFFIC",
    "AUTOSTART_ENV",
    "AUTOSTART_FILE",
    "AUTOSTART_TAG",
    "DEFAULT_CRIU_DIR",
    "ENVD_PORT",
    "Autostart",
    "BodyReader",
    "EgressRules",
    "EgressSettings",
    "EnvdClient",
    "EnvdTransport",
    "ExecutorError",
    "ExecutorInit",
    "ExecutorRefused",
    "ImageBuildError",
    "ImageStore",
    "KeptAliveTransport",
    "KubeApi",
    "KubeApiError",
    "KubeConnection",
    "KubeSettings",
    "KubeWarmPools",
    "KubernetesRuntime",
    "LeaderElection",
    "LocalRuntime",
    "LocalRuntimeSettings",
    "PlatformCheck",
    "PoolError",
    "PortClosed",
    "Reply",
    "Resources",
    "Runtime",
    "RuntimeCapabilities",
    "RuntimeFailure",
    "SandboxGone",
    "SandboxSpec",
    "SandboxStats",
    "SnapshotInfo",
    "SnapshotKind",
    "SocketOpener",
    "SocketTransport",
    "Template",
    "TemplateError",
    "WarmPoolStats",
    "WarmPools",
    "WarmRuntime",
    "check_platform",
    "envd",
    "kube_shapes",
    "load_templates",
    "open_kube_runtime",
    "post_init",
    "shell_command",
    "while_leading",
]
