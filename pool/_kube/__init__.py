"""The kubernetes runtime: sandboxes as ReplicaSets of one pod, reached at their pod IPs."""

from pool._kube._api import KubeApi, KubeApiError
from pool._kube._connection import Connection, in_cluster, load_kubeconfig
from pool._kube._leader import LeaderElection, while_leading
from pool._kube._manifest import EgressGuard
from pool._kube._runtime import KubernetesRuntime, KubeSettings, open_kube_runtime
from pool._kube._warm import KubeWarmPools

__all__ = [
    "Connection",
    "EgressGuard",
    "KubeApi",
    "KubeApiError",
    "KubeSettings",
    "KubeWarmPools",
    "KubernetesRuntime",
    "LeaderElection",
    "in_cluster",
    "load_kubeconfig",
    "open_kube_runtime",
    "while_leading",
]
