"""The parts of Kubernetes objects the stand-in kubelet reads, as msgspec structs (unknown fields ignored).

Only what the kubelet acts on is declared: the rest of a Pod passes by unread, so a newer or older
apiserver's extra fields never break decoding.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "Container",
    "EnvFromSource",
    "EnvVar",
    "ObjectMeta",
    "Pod",
    "PodList",
    "Probe",
    "WatchEvent",
]


class _Camel(msgspec.Struct, rename="camel", kw_only=True):
    """Kubernetes JSON is camelCase; absent fields take the API's documented defaults."""


class ObjectMeta(_Camel, kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None


class ObjectFieldSelector(_Camel, kw_only=True):
    field_path: str


class KeySelector(_Camel, kw_only=True):
    name: str = ""
    key: str
    optional: bool = False


class EnvVarSource(_Camel, kw_only=True):
    field_ref: ObjectFieldSelector | None = None
    config_map_key_ref: KeySelector | None = None
    secret_key_ref: KeySelector | None = None


class EnvVar(_Camel, kw_only=True):
    name: str
    value: str = ""
    value_from: EnvVarSource | None = None


class SourceRef(_Camel, kw_only=True):
    name: str = ""
    optional: bool = False


class EnvFromSource(_Camel, kw_only=True):
    prefix: str = ""
    config_map_ref: SourceRef | None = None
    secret_ref: SourceRef | None = None


class HTTPHeader(_Camel, kw_only=True):
    name: str
    value: str


class HTTPGetAction(_Camel, kw_only=True):
    port: int | str
    path: str = "/"
    host: str = ""
    scheme: str = "HTTP"
    http_headers: list[HTTPHeader] = []


class TCPSocketAction(_Camel, kw_only=True):
    port: int | str
    host: str = ""


class ExecAction(_Camel, kw_only=True):
    command: list[str] = []


class Probe(_Camel, kw_only=True):
    http_get: HTTPGetAction | None = None
    tcp_socket: TCPSocketAction | None = None
    exec: ExecAction | None = None
    initial_delay_seconds: int = 0
    period_seconds: int = 10
    timeout_seconds: int = 1
    success_threshold: int = 1
    failure_threshold: int = 3


class ContainerPort(_Camel, kw_only=True):
    container_port: int
    name: str = ""


class Capabilities(_Camel, kw_only=True):
    add: list[str] = []


class SecurityContext(_Camel, kw_only=True):
    capabilities: Capabilities | None = None


class Container(_Camel, kw_only=True):
    name: str
    image: str = ""
    command: list[str] = []
    args: list[str] = []
    env: list[EnvVar] = []
    env_from: list[EnvFromSource] = []
    working_dir: str = ""
    ports: list[ContainerPort] = []
    readiness_probe: Probe | None = None
    security_context: SecurityContext | None = None

    @property
    def adds_capabilities(self) -> bool:
        context = self.security_context
        return bool(context and context.capabilities and context.capabilities.add)


class PodSpec(_Camel, kw_only=True):
    containers: list[Container]
    init_containers: list[Container] = []
    node_name: str = ""
    scheduler_name: str = "default-scheduler"
    restart_policy: str = "Always"
    termination_grace_period_seconds: int = 30
    service_account_name: str = ""


class PodStatus(_Camel, kw_only=True):
    phase: str = ""
    pod_ip: str = ""


class Pod(_Camel, kw_only=True):
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus = msgspec.field(default_factory=PodStatus)

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


class ListMeta(_Camel, kw_only=True):
    resource_version: str = ""


class PodList(_Camel, kw_only=True):
    metadata: ListMeta
    items: list[Pod]


class WatchEvent(msgspec.Struct, kw_only=True):
    """One line of a watch stream; `object` is a Pod, or a Status when `type` is ERROR."""

    type: str
    object: msgspec.Raw
