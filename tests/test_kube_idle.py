"""The idle policy on the kubernetes runtime: an idle sandbox is paused in its pod (the executor stops its
processes), then scaled to zero, and the next request wakes it with its files, as with the local runtime."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests import kube_fixtures
from tests.kube_fixtures import Kube
from tests.polling import wait_for
from tests.scale_to_zero_fixtures import sandboxes_by_state
from tests.server_fixtures import RunningServer, running_server

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = pytest.mark.timeout(240)

PAUSE_AFTER, SNAPSHOT_AFTER = 2, 6


@pytest.fixture
def server(kube: Kube, kube_namespace: str, tmp_path: Path) -> Iterator[RunningServer]:
    args = [
        "--runtime", "kubernetes", "--kubeconfig", str(kube.kubeconfig), "--namespace", kube_namespace,
        "--kube-sandbox-user", "root", "--pause-after", str(PAUSE_AFTER), "--snapshot-after", str(SNAPSHOT_AFTER),
    ]  # fmt: skip
    with running_server(tmp_path / "data", *args) as server:
        yield server


def _replicas(kube: Kube, namespace: str, sandbox_id: str) -> str:
    path = "jsonpath={.spec.replicas}"
    return kube.kubectl("get", "replicaset", f"sandbox-{sandbox_id}", "-n", namespace, "-o", path).strip()


def _paused(server: RunningServer) -> bool:
    return sandboxes_by_state(server).get("paused", 0) == 1


def test_idle_sandbox_is_paused_then_scaled_to_zero_and_woken_by_a_request(
    server: RunningServer, kube: Kube, kube_namespace: str
) -> None:
    sbx = Sandbox.create(timeout=200, api_key=server.api_key, api_url=server.url, sandbox_url=server.url)
    try:
        sbx.files.write("idle.txt", "kept while idle")  # relative: the sandbox's working directory
        assert not _paused(server)  # so the wait below sees the idle pause happen
        wait_for(lambda: _paused(server), what="the idle pause")
        assert _replicas(kube, kube_namespace, sbx.sandbox_id) == "1"  # paused in its pod: memory kept
        # The ReplicaSet reaches 0 replicas before the transition ends: wait for the state, then check the scale.
        wait_for(lambda: sandboxes_by_state(server).get("snapshotted") == 1, what="the idle snapshot")
        assert _replicas(kube, kube_namespace, sbx.sandbox_id) == "0"  # scaled to zero
        assert sbx.get_info().state == "running"  # an idle pause is invisible on the E2B API
        woke = httpx.get(
            f"{server.url}/health", headers={"Host": f"49983-{sbx.sandbox_id}.sandbox.localhost"}, timeout=60
        )
        assert woke.status_code == 204
        assert _replicas(kube, kube_namespace, sbx.sandbox_id) == "1"
        assert sbx.files.read("idle.txt") == "kept while idle"
        assert sandboxes_by_state(server).get("running") == 1  # woken, not left snapshotted
    finally:
        sbx.kill()
