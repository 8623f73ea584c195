"""A sandbox as Kubernetes objects: the ReplicaSet the runtime creates, and the fields it reads back.

Labels (selectable; every key is in `_shapes`): `agent-sandbox.dev/role: sandbox`, `agent-sandbox.dev/sandbox-id`,
`agent-sandbox.dev/template`, and `agent-sandbox.dev/egress: own` on its pods while it has egress rules of its own
(its NetworkPolicy's, `_egress`). Annotations: the caller's (`SandboxSpec.annotations`: owner key, metadata,
lifecycle), and while the sandbox is snapshotted its archive record (`pool._kube._archive`). Secrets never go
into objects: the access token and the caller's env vars reach the executor through its `POST /init`, not the
pod spec. Resources: limits are the template's; requests are a quarter of its memory and a tenth of a CPU,
since most sandboxes sit idle.

Syscalls: the container runtime's default seccomp profile (`RuntimeDefault`), where the kubelet's default is
Unconfined. Nothing in a sandbox needs more: pause is SIGSTOP (no CRIU, no ptrace), the executor starts commands
with setuid/setgid and makes itself a subreaper with prctl, and the same templates run on the local runtime
under our own filter (`pool._local._seccomp`), which refuses namespaces, mounts, ptrace, BPF and the keyring.
The pods stay Pod Security "baseline": "restricted" would also need an executor that is not root.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

from executor.envd import ENVD_PORT
from pool._kube._guard_wire import GUARD_CONTAINER, GUARD_KEY_ENV, GUARD_POD_ENV, GUARD_PORT
from pool._kube._shapes import (
    EGRESS_LABEL,
    GUARD_KEY_FIELD,
    GUARD_KEY_SECRET,
    ID_LABEL,
    OWN_EGRESS,
    ROLE_LABEL,
    SANDBOX_ROLE,
    TEMPLATE_LABEL,
    replica_set_name,
)
from pool._runtime import EgressRules, SandboxSpec

__all__ = [
    "EgressGuard",
    "KubeObject",
    "ObjectList",
    "ObjectMeta",
    "Pod",
    "PodList",
    "ReplicaSet",
    "ReplicaSetList",
    "WatchEvent",
    "replica_set",
]

_GRACE_SECONDS = 10  # the executor ends its processes on SIGTERM at once; this only bounds a stuck one


class EgressGuard(msgspec.Struct, frozen=True, kw_only=True):
    """The egress guard every sandbox pod runs beside its executor (`_guard`): the image it comes from (the
    gateway's) and what it is told besides its rules."""

    image: str
    dns_servers: tuple[str, ...] = ()  # the sandboxes' resolvers; () = the pod's own (cluster DNS)
    denied: tuple[str, ...] = ()  # CIDRs no sandbox reaches, on top of the private ranges and its node's address


def replica_set(
    spec: SandboxSpec,
    *,
    image_prefix: str,
    executor_args: tuple[str, ...],
    service_account: str | None = None,
    guard: EgressGuard | None = None,
) -> dict[str, Any]:
    """The ReplicaSet of one sandbox: one pod of the template's image, Ready once its executor answers (and its
    egress guard, with `guard`, holds the pod's network closed).

    `service_account` names the pods' ServiceAccount (None: the namespace's `default`); its token is never
    mounted either way."""
    template = spec.template
    labels = {ROLE_LABEL: SANDBOX_ROLE, ID_LABEL: spec.sandbox_id, TEMPLATE_LABEL: template.name}
    own_egress = {EGRESS_LABEL: OWN_EGRESS} if spec.egress != EgressRules() else {}
    resources = template.resources
    container = {
        "name": "executor",
        "image": template.image or image_prefix + template.name,
        "args": list(executor_args),
        "env": [{"name": name, "value": value} for name, value in template.env.items()],
        "ports": [{"name": "envd", "containerPort": ENVD_PORT}],
        "resources": {
            "requests": {"cpu": "100m", "memory": f"{max(resources.memory_mb // 4, 32)}Mi"},
            "limits": {
                "cpu": str(resources.cpu_count),
                "memory": f"{resources.memory_mb}Mi",
                "ephemeral-storage": f"{resources.disk_mb}Mi",
            },
        },
        "readinessProbe": {"httpGet": {"path": "/health", "port": ENVD_PORT}, "periodSeconds": 5},
        # NET_RAW would let root in the sandbox mark its packets (SO_MARK) as the egress guard's, and craft any.
        "securityContext": {"capabilities": {"drop": ["NET_RAW"]}},
    }
    containers, volumes, init = [container], [], []
    if guard is not None:
        # The kubelet starts the containers one after another without waiting for the guard: the init container
        # closes the pod's network first, and the executor starts only after it has.
        init.append(_guard_container(guard, close=True))
        containers.insert(0, _guard_container(guard))
        volumes.append({"name": _GUARD_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    metadata = {"name": replica_set_name(spec.sandbox_id), "labels": labels, "annotations": dict(spec.annotations)}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {ID_LABEL: spec.sandbox_id}},
            "template": {
                "metadata": {"labels": {**labels, **own_egress}},
                "spec": {
                    **({"initContainers": init} if init else {}),
                    "containers": containers,
                    **({"volumes": volumes} if volumes else {}),
                    "terminationGracePeriodSeconds": _GRACE_SECONDS,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "automountServiceAccountToken": False,  # a sandbox has no business with the API
                    "enableServiceLinks": False,
                    **({"serviceAccountName": service_account} if service_account else {}),
                },
            },
        },
    }


_GUARD_VOLUME = "egress-guard"
# `agent-sandbox-egress-guard`, with SIGTERM handled from its first line: the guard is its container's PID 1,
# which the kernel spares every signal it has no handler for, and importing `pool` takes half a second, so a pod
# deleted while it starts (a warm claim's spare, a resume's) would wait out its grace period for each container.
_GUARD_COMMAND = [
    "python3", "-c",
    "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    "from pool._kube._guard import main; main()",
]  # fmt: skip
_GUARD_STATE = "/run/agent-sandbox-guard"
_NODE_IP_ENV = "AGENT_SANDBOX_NODE_IP"


def _guard_container(guard: EgressGuard, *, close: bool = False) -> dict[str, Any]:
    """Root with two capabilities and nothing else: NET_ADMIN for the pod's table and its packets' mark,
    NET_BIND_SERVICE for its sockets on ports 1 and 53. With `close`, the init container that puts no-internet
    in force and exits. Else the guard: a startup probe (not a readiness one, which would keep probing every pod
    for good) holds the pod unready until it listens."""
    security = {
        "runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_BIND_SERVICE"]},
    }  # fmt: skip
    if close:
        resources = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}}
        return {
            "name": f"{GUARD_CONTAINER}-close", "image": guard.image,
            "command": [*_GUARD_COMMAND, "--close"], "resources": resources, "securityContext": security,
        }  # fmt: skip
    flags = [*(f"--dns={server}" for server in guard.dns_servers), *(f"--denied={cidr}" for cidr in guard.denied)]
    key = {"secretKeyRef": {"name": GUARD_KEY_SECRET, "key": GUARD_KEY_FIELD}}
    return {
        "name": GUARD_CONTAINER,
        "image": guard.image,
        "command": [*_GUARD_COMMAND, f"--state-dir={_GUARD_STATE}", *flags, f"--denied=$({_NODE_IP_ENV})"],
        "env": [
            {"name": GUARD_KEY_ENV, "valueFrom": key},
            {"name": GUARD_POD_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": _NODE_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ],
        "ports": [{"name": "egress-guard", "containerPort": GUARD_PORT}],
        "startupProbe": {"tcpSocket": {"port": GUARD_PORT}, "periodSeconds": 1, "failureThreshold": 120},
        # Each busy relay holds up to 2 MiB of pipe (pool/_local/_egress_relay.py): room for ~100 at once.
        "resources": {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "securityContext": security,
        "volumeMounts": [{"name": _GUARD_VOLUME, "mountPath": _GUARD_STATE}],
    }


class _OwnerReference(msgspec.Struct, frozen=True, kw_only=True):
    kind: str = ""
    name: str = ""
    controller: bool = False


class ObjectMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The metadata fields the runtime and the warm pools read (a watch's bookmark has only `resource_version`)."""

    name: str = ""
    uid: str = ""
    owner_references: list[_OwnerReference] = []
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    resource_version: str = ""
    creation_timestamp: str | None = None  # RFC 3339 in UTC, whole seconds: sorts as text (null in bookmarks)
    deletion_timestamp: str | None = None


class KubeObject(msgspec.Struct, frozen=True, kw_only=True):
    """The fields every object the runtime watches has: its metadata, labelled with its sandbox."""

    metadata: ObjectMeta

    @property
    def sandbox_id(self) -> str | None:
        return self.metadata.labels.get(ID_LABEL)


class _Condition(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    status: str


class _ContainerState(msgspec.Struct, frozen=True, kw_only=True):
    waiting: dict[str, object] | None = None
    running: dict[str, object] | None = None
    terminated: dict[str, object] | None = None

    def __str__(self) -> str:
        """ "running", "terminated", "waiting (ContainerCreating)": the state as `kubectl describe` words it."""
        for word, detail in (("terminated", self.terminated), ("waiting", self.waiting)):
            if detail is not None:
                return f"{word} ({detail['reason']})" if detail.get("reason") else word
        return "running" if self.running is not None else "unknown"


class _ContainerStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    state: _ContainerState = _ContainerState()


class _PodStatus(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pod_ip: str = msgspec.field(default="", name="podIP")
    conditions: list[_Condition] = []
    container_statuses: list[_ContainerStatus] = []
    init_container_statuses: list[_ContainerStatus] = []  # a sidecar a webhook injected may outlive the executor
    ephemeral_container_statuses: list[_ContainerStatus] = []


class Pod(KubeObject, frozen=True, kw_only=True):
    """The fields of a pod the runtime reads."""

    status: _PodStatus = _PodStatus()

    @property
    def ready_ip(self) -> str | None:
        """The pod's IP once it is Ready (its executor answers) and not being deleted."""
        ready = any(c.type == "Ready" and c.status == "True" for c in self.status.conditions)
        alive = self.metadata.deletion_timestamp is None
        return self.status.pod_ip if ready and alive and self.status.pod_ip else None

    @property
    def ended(self) -> bool:
        """Being deleted with every container terminated: nothing of it runs any more. A real kubelet removes such
        a pod up to 10 s later (its status manager's sync period), which no caller has to wait for."""
        statuses = self._statuses
        ended = bool(statuses) and all(s.state.terminated is not None for s in statuses)
        return self.metadata.deletion_timestamp is not None and ended

    @property
    def _statuses(self) -> list[_ContainerStatus]:
        status = self.status
        return [*status.init_container_statuses, *status.container_statuses, *status.ephemeral_container_statuses]

    def __str__(self) -> str:
        """The pod, whether it is being deleted, and the state of each container: what a timeout names."""
        containers = ", ".join(f"{s.name} {s.state}" for s in self._statuses) or "none reported yet"
        deleted = self.metadata.deletion_timestamp
        return f"pod {self.metadata.name} ({f'deleted at {deleted}' if deleted else 'not deleted'}; {containers})"


class _ReplicaSetSpec(msgspec.Struct, frozen=True, kw_only=True):
    replicas: int = 1


class ReplicaSet(KubeObject, frozen=True, kw_only=True):
    """The fields of a sandbox's ReplicaSet the runtime reads: how many pods it wants, and its annotations."""

    spec: _ReplicaSetSpec = _ReplicaSetSpec()

    @property
    def deleting(self) -> bool:
        return self.metadata.deletion_timestamp is not None


class _ListMeta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    resource_version: str = ""


T = TypeVar("T", bound=KubeObject)


class ObjectList(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    """A list answer: its items, and the resourceVersion a watch resumes from."""

    metadata: _ListMeta = _ListMeta()
    items: list[T] = []


PodList = ObjectList[Pod]
ReplicaSetList = ObjectList[ReplicaSet]


class WatchEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One line of a watch: ADDED, MODIFIED, DELETED, BOOKMARK (objects), or ERROR (a Status)."""

    type: str
    object: msgspec.Raw
