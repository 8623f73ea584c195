"""`agent-sandbox serve --runtime kubernetes` against the dev cluster, driven by the real `e2b` SDK.

The E2B issue's SDK checks on the second runtime: create, commands, files, list, kill, pause / connect (the
sandbox scaled to zero and back with its files), and a held burst released by one resume. Each runs twice: on
the stand-in kubelet (sandboxes as root: its pods are host processes) and on the real node (the image of
deploy/Dockerfile.sandbox-base, sandboxes as `user`, the gateway in the node's namespace).
"""

from __future__ import annotations

import json
import os
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxException, SandboxQuery, Volume, VolumeException

from tests import kube_fixtures, real_node_fixtures
from tests.kube_fixtures import Kube, live_pods
from tests.polling import wait_for
from tests.real_node_fixtures import RealNode, gateway_on_node, install_templates
from tests.scale_to_zero_fixtures import health_burst, metric
from tests.server_fixtures import RunningServer, point_e2b_at, running_server

# Bound under names of their own: `kube` is this module's cluster of either kind (tests/conftest.py derives the
# tiers from the names code uses, so no code here names `real_node`: the realnode tier is its parameter's mark).
stand_in = kube_fixtures.kube
real_node_cluster = real_node_fixtures.real_node

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

BURST = 300


@pytest.fixture(scope="module", params=["stand-in", pytest.param("real-node", marks=pytest.mark.realnode)])
def kube(request: pytest.FixtureRequest) -> Kube:
    if request.param == "real-node":
        node: RealNode = request.getfixturevalue("real_node_cluster")
        return node.kube
    stand_in_kube: Kube = request.getfixturevalue("stand_in")
    return stand_in_kube


def _sandbox_user(kube: Kube) -> str:
    return "user" if kube.on_real_node else "root"


@pytest.fixture(scope="module")
def namespace(kube: Kube) -> Iterator[str]:
    name = f"e2b-{secrets.token_hex(4)}"
    kube.kubectl("create", "namespace", name)
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="module")
def server(kube: Kube, namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("kube-e2b")
    if kube.on_real_node:
        templates = install_templates(directory / "templates")  # with the images the Dockerfiles build
        with gateway_on_node(RealNode(kube), directory / "data", "--namespace", namespace, "--templates",
                             str(templates)) as server:  # fmt: skip
            yield server
        return
    kube_args = ["--runtime", "kubernetes", "--kubeconfig", str(kube.kubeconfig), "--namespace", namespace]
    # The stand-in runs executors on the host, which has no `user` account: every sandbox runs as root.
    with running_server(directory / "data", *kube_args, "--kube-sandbox-user", "root") as server:
        yield server


@pytest.fixture(autouse=True)
def e2b_env(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    point_e2b_at(server, monkeypatch)


def _replica_sets(kube: Kube, namespace: str) -> list[str]:
    return kube.kubectl("get", "replicasets", "-n", namespace, "-o", "name").split()


def _replicas_of(kube: Kube, namespace: str, sandbox_id: str) -> str:
    path = "jsonpath={.spec.replicas}"
    return kube.kubectl("get", "replicaset", f"sandbox-{sandbox_id}", "-n", namespace, "-o", path).strip()


def test_e2b_sdk_creates_uses_and_kills_a_sandbox_on_kubernetes(kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(envs={"GREETING": "hello"}, timeout=120)
    try:
        assert f"replicaset.apps/sandbox-{sbx.sandbox_id}" in _replica_sets(kube, namespace)
        result = sbx.commands.run("echo $GREETING; id -un")
        assert result.stdout.split() == ["hello", _sandbox_user(kube)]
        workdir = sbx.commands.run("pwd").stdout.strip()  # on the stand-in, the pod's own directory on the host
        sbx.files.write(f"{workdir}/note.txt", "written through the SDK")
        assert sbx.files.read(f"{workdir}/note.txt") == "written through the SDK"
        assert [entry.name for entry in sbx.files.list(workdir) if entry.name == "note.txt"] == ["note.txt"]
    finally:
        sbx.kill()
    wait_for(lambda: f"replicaset.apps/sandbox-{sbx.sandbox_id}" not in _replica_sets(kube, namespace),
             what="the ReplicaSet to go")  # fmt: skip
    assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list().next_items()}


def test_the_replica_set_shows_owner_metadata_and_lifecycle_but_no_secret(kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(metadata={"team": "blue"}, envs={"SECRET_VALUE": "hunter2"}, timeout=120)
    try:
        raw = kube.kubectl("get", "replicaset", f"sandbox-{sbx.sandbox_id}", "-n", namespace, "-o", "json")
        annotations = json.loads(raw)["metadata"]["annotations"]
        assert json.loads(annotations["agent-sandbox.dev/metadata"]) == {"team": "blue"}
        assert json.loads(annotations["agent-sandbox.dev/lifecycle"])["on_timeout"] == "kill"
        assert annotations["agent-sandbox.dev/owner"]  # the API key's id
        assert "hunter2" not in raw
        assert os.environ["E2B_API_KEY"] not in raw
        assert "hunter2" not in kube.kubectl("get", "pods", "-n", namespace, "-o", "json")
    finally:
        sbx.kill()


def test_list_shows_the_sandboxes_of_the_namespace_by_metadata() -> None:
    tag = secrets.token_hex(4)
    first = Sandbox.create(metadata={"run": tag, "n": "1"}, timeout=120)
    second = Sandbox.create(metadata={"run": tag, "n": "2"}, timeout=120)
    try:
        listed = Sandbox.list(query=SandboxQuery(metadata={"run": tag})).next_items()
        assert {s.sandbox_id for s in listed} == {first.sandbox_id, second.sandbox_id}
        only = Sandbox.list(query=SandboxQuery(metadata={"run": tag, "n": "2"})).next_items()
        assert [s.sandbox_id for s in only] == [second.sandbox_id]
        second.kill()
        assert [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"run": tag})).next_items()] == [
            first.sandbox_id
        ]
    finally:
        first.kill()
        second.kill()


def test_pause_scales_to_zero_and_connect_brings_the_files_back(kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        workdir = sbx.commands.run("pwd").stdout.strip()
        sbx.files.write(f"{workdir}/kept.txt", "survives the snapshot")
        assert sbx.pause()
        assert sbx.get_info().state == "paused"
        assert _replicas_of(kube, namespace, sbx.sandbox_id) == "0"
        assert live_pods(kube, namespace, sbx.sandbox_id) == []
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=120)
        assert resumed.get_info().state == "running"
        assert _replicas_of(kube, namespace, sbx.sandbox_id) == "1"
        assert resumed.files.read(f"{workdir}/kept.txt") == "survives the snapshot"
        assert resumed.commands.run(f"cat {workdir}/kept.txt").stdout == "survives the snapshot"
    finally:
        sbx.kill()


async def test_a_held_burst_is_released_by_one_resume(server: RunningServer, kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True}, timeout=120)
    try:
        assert sbx.pause()
        assert _replicas_of(kube, namespace, sbx.sandbox_id) == "0"
        activations = metric(server, "agent_sandbox_activations_total", result="ok")
        held = metric(server, "agent_sandbox_holds_total", result="resumed")
        replies = await health_burst(server.port, sbx.sandbox_id, BURST)
        statuses = Counter(reply.status for reply in replies)
        assert len(statuses) == 1
        assert statuses[200] + statuses[204] == BURST
        assert statuses[204] == BURST  # the executor's /health: every held request got the woken sandbox's answer
        assert metric(server, "agent_sandbox_activations_total", result="ok") == activations + 1  # single flight
        assert metric(server, "agent_sandbox_holds_total", result="resumed") - held > BURST // 2
        assert _replicas_of(kube, namespace, sbx.sandbox_id) == "1"
        assert sbx.get_info().state == "running"
    finally:
        sbx.kill()


def test_the_server_keeps_nothing_of_the_cluster_state_on_its_disk(server: RunningServer) -> None:
    """Records and key digests live in the namespace's Secrets: no state database in the data dir."""
    assert server.data_dir.is_dir()  # the check below looks where a state database would be
    assert not Path(server.data_dir / "state.db").exists()


def test_volumes_are_refused_on_kubernetes_by_name() -> None:
    with pytest.raises(VolumeException, match="501: volumes are not supported by this server's runtime"):
        Volume.create("data")
    with pytest.raises(SandboxException, match="501: volumes are not supported by this server's runtime"):
        Sandbox.create(volume_mounts={"/data": "data"})
