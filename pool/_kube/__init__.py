"""The kubernetes runtime: sandboxes as ReplicaSets of one pod, reached at their pod IPs."""

from pool._kube._api import KubeApi, KubeApiError
from pool._kube._connection import Connection, in_cluster, load_kubeconfig
from pool._kube._runtime import KubernetesRuntime, KubeSettings, open_kube_runtime

__all__ = [
    "Connection",
    "KubeApi",
    "KubeApiError",
    "KubeSettings",
    "KubernetesRuntime",
    "in_cluster",
    "load_kubeconfig",
    "open_kube_runtime",
]
