"""Where the dev cluster keeps its files and which loopback ports it uses, derived from one state dir."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec

__all__ = [
    "DEFAULT_BIN_DIR", "DEFAULT_NODE_BIN_DIR", "DEFAULT_STATE_DIR", "ClusterLayout", "built_bin_dir", "decode_layout",
    "encode_layout",
]  # fmt: skip

DEFAULT_STATE_DIR = Path("/var/lib/agent-sandbox-kube")
DEFAULT_BIN_DIR = Path("/var/cache/agent-sandbox/kubernetes/v1.20.2-r1/bin")
DEFAULT_NODE_BIN_DIR = Path("/var/cache/agent-sandbox/kubernetes/v1.20.2-node-r1/bin")  # build-kubernetes node
NODE_NAME = "agent-sandbox-dev-node"


def built_bin_dir(default: Path) -> Path:
    """Where scripts/kube/build-kubernetes put the binaries of `default`'s build: under $AGENT_SANDBOX_KUBE_DIR
    when that is set, as the script reads it."""
    cache = os.environ.get("AGENT_SANDBOX_KUBE_DIR")
    return Path(cache) / default.parent.name / "bin" if cache else default


class ClusterLayout(msgspec.Struct, frozen=True, kw_only=True):
    """The state dir's layout; every process of the cluster reads its paths from here, nowhere else."""

    state_dir: Path = DEFAULT_STATE_DIR
    bin_dir: Path = DEFAULT_BIN_DIR
    etcd: Path = Path("/usr/bin/etcd")
    apiserver_port: int = 16443
    etcd_port: int = 12379  # and the next port for etcd's peer listener
    node_name: str = NODE_NAME
    pod_network: int = 0  # pods get 127.<pod_network>.x.y, so two clusters on one machine never share an address
    # A real kubelet + containerd in a namespace of the cluster's own (`up --real-node`) instead of the stand-in.
    real_node: bool = False
    node_bin_dir: Path = DEFAULT_NODE_BIN_DIR
    node_ip: str = "10.99.0.1"  # inside the node's namespace only, as is everything of a real-node cluster
    pod_cidr: str = "10.244.0.0/24"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def run(self) -> Path:
        return self.state_dir / "run"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def pods(self) -> Path:
        """Per-pod working directories and container logs of the stand-in kubelet."""
        return self.state_dir / "pods"

    @property
    def node_dir(self) -> Path:
        """The real node's own files: containerd's root and state, the kubelet's, the CNI's, its /run."""
        return self.state_dir / "node"

    @property
    def etcd_data(self) -> Path:
        return self.state_dir / "etcd"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    def kubeconfig(self, user: str) -> Path:
        return self.state_dir / f"{user}.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def cgroup_name(self) -> str:
        """The parent cgroup of this cluster's pods, one per state dir so two clusters never share one."""
        return "agent-sandbox-kube-" + hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:10]


def _to_path(kind: type, value: object) -> object:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(kind)


def encode_layout(layout: ClusterLayout) -> bytes:
    return msgspec.json.encode(layout, enc_hook=str)


def decode_layout(data: bytes | dict[str, object]) -> ClusterLayout:
    """From `layout.json`, or from a dict of fields (strings for paths) over the defaults."""
    if isinstance(data, bytes):
        return msgspec.json.decode(data, type=ClusterLayout, dec_hook=_to_path)
    return msgspec.convert(data, ClusterLayout, dec_hook=_to_path)
