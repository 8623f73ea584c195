"""A real Kubernetes control plane on loopback for development and tests (`scripts/kube-dev-cluster`).

etcd, kube-apiserver and kube-controller-manager (built once from Debian's source package by
`scripts/kube/build-kubernetes`) run on 127.0.0.1 with RBAC on, and a stand-in kubelet written here binds
pods to one node and runs each pod's containers as local processes on a loopback address of their own.
It exists so that the `kubernetes` runtime and `install.yaml` are tested against real API semantics
(resourceVersions, watches, the ReplicaSet controller, garbage collection, RBAC) without a container engine.
With `up --real-node` the same control plane gets a real kubelet, kube-scheduler and containerd instead,
running the images of deploy/Dockerfile.* in a network and mount namespace of its own (`_node_namespace`,
`_real_node`, `_images`, `_bridge`). Nothing in the product imports it.
"""

__all__: list[str] = []  # it runs as `python -m kube_dev` (scripts/kube-dev-cluster); the tests drive its modules
