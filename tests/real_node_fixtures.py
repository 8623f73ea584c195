"""A real Kubernetes node (`scripts/kube-dev-cluster up --real-node`) for tests, and gateways run beside it.

The cluster is the stand-in's control plane plus a real kubelet + containerd + runc running the images
buildah built from deploy/Dockerfile.*, all in a network and mount namespace of its own; its apiserver is
bridged to this machine's loopback, so `Kube` works on it as on the stand-in's cluster. A gateway started
with `gateway_on_node` runs in that namespace (it must reach the pods' addresses) and is bridged out too.
One cluster per session, stopped at the end. Without the built binaries the tests skip, except under
CI=true, where they fail.
(Bind the fixture in a test module with `real_node = real_node_fixtures.real_node`.)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no annotations; only safe_load_all is used

from kube_dev._daemons import running_pid
from kube_dev._layout import DEFAULT_NODE_BIN_DIR, built_bin_dir
from kube_dev._node_namespace import KUBELET_SYSCTLS, nsenter_argv
from kube_dev._real_node import CNI_PLUGINS
from tests.kube_fixtures import Kube, require_binaries, shared_cluster
from tests.polling import wait_for
from tests.server_fixtures import REPO, RunningServer, free_port, running_server, stop_process

__all__ = [
    "SYSCTLS_AT_START", "RealNode", "gateway_on_node", "install_templates", "machine_sysctls", "real_node",
    "require_real_node",
]  # fmt: skip


@dataclass(frozen=True)
class RealNode:
    """A running real-node cluster: the `Kube` to reach its apiserver, and the way into its namespace."""

    kube: Kube

    @property
    def holder(self) -> int:
        pid = running_pid(self.kube.layout.run, "node-namespace")
        assert pid is not None, "the real node's namespace is gone"
        return pid

    def in_namespace(self) -> list[str]:
        """The prefix that runs a command in the node's network namespace."""
        return nsenter_argv(self.holder, mount=False)

    @contextlib.contextmanager
    def bridged(self, port: int, target: str = "") -> Iterator[int]:
        """127.0.0.1:`port` here forwards to 127.0.0.1:`port` in the namespace, or to `target` (HOST:PORT)."""
        spec = f"{port}:{target}" if target else str(port)
        argv = [sys.executable, "-m", "kube_dev", "bridge", "--state-dir", str(self.kube.layout.state_dir),
                "--port", spec]  # fmt: skip
        process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: _listening(port) or process.poll() is not None, what=f"the bridge of port {port}")
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            yield port
        finally:
            stop_process(process)
            if process.stderr:
                process.stderr.close()


def machine_sysctls() -> dict[str, str]:
    """The kubelet's six kernel tunables as this machine has them now."""
    return {name: Path(f"/proc/sys/{name}").read_text() for name in KUBELET_SYSCTLS}


# As the machine had them when the suite started (this module is imported at collection, before any real node
# runs): a node that wrote them machine-wide would change these.
SYSCTLS_AT_START = machine_sysctls()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def require_real_node() -> None:
    require_binaries()
    node_bin = built_bin_dir(DEFAULT_NODE_BIN_DIR)
    needed = [node_bin / "kubelet", node_bin / "kube-scheduler", node_bin / "pause", *CNI_PLUGINS]
    missing = [str(p) for p in needed if not p.exists()]
    missing += [tool for tool in ("containerd", "runc", "buildah", "nsenter") if shutil.which(tool) is None]
    if missing:
        message = f"the real node is not built ({', '.join(missing)}): run scripts/kube-dev-cluster build --real-node"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """The session's real-node cluster, started with `up --real-node` and stopped with `down`."""
    require_real_node()
    with shared_cluster(tmp_path_factory, real_node=True) as cluster:
        yield RealNode(cluster)


def new_namespace(node: RealNode) -> str:
    """A namespace of its own on the real node, for one module's (or test's) gateway."""
    name = f"real-{secrets.token_hex(4)}"
    node.kube.kubectl("create", "namespace", name)
    return name


@pytest.fixture(scope="module")
def namespace(real_node: RealNode) -> Iterator[str]:
    """The module's namespace on the real node, deleted (without waiting) after it."""
    name = new_namespace(real_node)
    yield name
    real_node.kube.kubectl("delete", "namespace", name, "--wait=false")


def install_templates(directory: Path) -> Path:
    """install.yaml's templates ConfigMap as files in `directory` (what its volume shows the gateway): templates
    with the `image` that deploy/Dockerfile.sandbox-* builds."""
    directory.mkdir(parents=True, exist_ok=True)
    for document in yaml.safe_load_all((REPO / "install.yaml").read_text()):
        if document and document["kind"] == "ConfigMap" and document["metadata"]["name"] == "agent-sandbox-templates":
            for name, text in document["data"].items():
                (directory / name).write_text(text)
    return directory


@contextlib.contextmanager
def gateway_on_node(node: RealNode, data_dir: Path, *args: str) -> Iterator[RunningServer]:
    """`agent-sandbox serve --runtime kubernetes` in the node's namespace on the admin kubeconfig, bridged here."""
    port = free_port()
    kube_args = ["--runtime", "kubernetes", "--kubeconfig", str(node.kube.kubeconfig)]
    with (
        node.bridged(port),
        running_server(data_dir, *kube_args, *args, port=port, wrap=node.in_namespace()) as server,
    ):
        yield server
