"""`agent-sandbox serve --runtime kubernetes` against the dev cluster, driven by the real `e2b` SDK."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2b import Sandbox

from tests import kube_fixtures
from tests.kube_fixtures import Kube, wait_for
from tests.server_fixtures import running_server

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = pytest.mark.timeout(240)


def _replica_sets(kube: Kube, namespace: str) -> list[str]:
    return kube.kubectl("get", "replicasets", "-n", namespace, "-o", "name").split()


def test_e2b_sdk_creates_uses_and_kills_a_sandbox_on_kubernetes(
    kube: Kube, kube_namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube_args = ["--runtime", "kubernetes", "--kubeconfig", str(kube.kubeconfig), "--namespace", kube_namespace]
    # The dev cluster runs executors on the host, which has no `user` account: every sandbox runs as root.
    with running_server(tmp_path / "data", *kube_args, "--kube-sandbox-user", "root") as server:
        for name, value in server.e2b_env().items():
            monkeypatch.setenv(name, value)
        sbx = Sandbox.create(envs={"GREETING": "hello"}, timeout=120)
        try:
            assert _replica_sets(kube, kube_namespace) == [f"replicaset.apps/sandbox-{sbx.sandbox_id}"]
            result = sbx.commands.run("echo $GREETING; id -un")
            assert result.stdout.split() == ["hello", "root"]
            path = str(tmp_path / f"{sbx.sandbox_id}.txt")  # the dev cluster's pods share the host's files
            sbx.files.write(path, "written through the SDK")
            assert sbx.files.read(path) == "written through the SDK"
        finally:
            sbx.kill()
        wait_for(lambda: not _replica_sets(kube, kube_namespace), what="the ReplicaSet to go")
        assert not Sandbox.list().next_items()
