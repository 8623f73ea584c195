"""A real Kubernetes control plane on loopback for development and tests (`scripts/kube-dev-cluster`).

etcd, kube-apiserver and kube-controller-manager (built once from Debian's source package by
`scripts/kube/build-kubernetes`) run on 127.0.0.1 with RBAC on, and a stand-in kubelet written here binds
pods to one node and runs each pod's containers as local processes on a loopback address of their own.
It exists so that the `kubernetes` runtime and `install.yaml` are tested against real API semantics
(resourceVersions, watches, the ReplicaSet controller, garbage collection, RBAC) without a container engine.
Nothing in the product imports it.
"""

__all__: list[str] = []  # it runs as `python -m kube_dev` (scripts/kube-dev-cluster); the tests drive its modules
