"""The local cluster of `scripts/kube-dev-cluster` and its stand-in kubelet, against a real apiserver."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from executor.envd import ENVD_PORT
from tests import kube_fixtures
from tests.kube_fixtures import SCRIPT, Kube, free_port, free_port_pair, require_binaries
from tests.polling import wait_for

# The fixtures, by name in this module (pytest finds fixtures by the names a test module binds).
kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = pytest.mark.timeout(180)


def _pod(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "debian:bookworm", "command": command, **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container], **spec}}


def _http_server(port: int) -> list[str]:
    return ["python3", "-m", "http.server", "--bind", "$(POD_IP)", str(port)]


_POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _get_pod(client: httpx.Client, namespace: str, name: str) -> dict[str, Any] | None:
    response = client.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    if response.status_code == 404:
        return None
    response.raise_for_status()
    pod: dict[str, Any] = response.json()
    return pod


def _pod_when(
    client: httpx.Client, namespace: str, name: str, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    """The pod once `condition` holds for it, else None (what `wait_for` polls)."""
    pod = _get_pod(client, namespace, name)
    return pod if pod is not None and condition(pod) else None


def _phase(phase: str) -> Callable[[dict[str, Any]], bool]:
    return lambda pod: bool(pod["status"].get("phase") == phase)


def _ready(pod: dict[str, Any] | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _accepts(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=1).close()
    except OSError:
        return False
    return True


def _processes_with(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_pod_with_readiness_probe_becomes_ready_on_its_loopback_ip_and_serves_http(
    kube: Kube, kube_namespace: str
) -> None:
    probe = {"httpGet": {"path": "/", "port": 8080}}
    pod = _pod("web", _http_server(8080), container={"env": [_POD_IP], "readinessProbe": probe})
    with kube.client() as client:
        client.post(f"/api/v1/namespaces/{kube_namespace}/pods", json=pod).raise_for_status()
        ready = wait_for(lambda: _pod_when(client, kube_namespace, "web", _ready), what="Ready")
        ip = ready["status"]["podIP"]
        assert ip.startswith(f"127.{kube.layout.pod_network}.")
        assert ready["spec"]["nodeName"] == kube.layout.node_name
        assert ready["status"]["containerStatuses"][0]["state"]["running"]
        assert httpx.get(f"http://{ip}:8080/", trust_env=False).status_code == 200

        client.delete(f"/api/v1/namespaces/{kube_namespace}/pods/web").raise_for_status()
        wait_for(lambda: _get_pod(client, kube_namespace, "web") is None, what="the pod to be deleted")
        assert not _accepts(ip, 8080)
        assert not _processes_with(f"--bind {ip} 8080")


def test_pod_is_not_ready_while_its_probe_fails(kube: Kube, kube_namespace: str) -> None:
    probe = {"tcpSocket": {"port": 9}, "periodSeconds": 1}
    pod = _pod("idle", ["sleep", "300"], container={"readinessProbe": probe})
    with kube.client() as client:
        client.post(f"/api/v1/namespaces/{kube_namespace}/pods", json=pod).raise_for_status()
        running = wait_for(lambda: _pod_when(client, kube_namespace, "idle", _phase("Running")), what="Running")
        assert not _ready(running)
        assert running["status"]["containerStatuses"][0]["ready"] is False


def test_env_vars_reach_the_process(kube: Kube, kube_namespace: str, tmp_path: Path) -> None:
    out = tmp_path / "env"
    with kube.client() as client:
        configmap = {"metadata": {"name": "settings"}, "data": {"color": "green"}}
        client.post(f"/api/v1/namespaces/{kube_namespace}/configmaps", json=configmap).raise_for_status()
        env = [
            {"name": "GREETING", "value": "hello"},
            {"name": "PHRASE", "value": "$(GREETING) world"},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "color"}}},
        ]
        script = f'echo "$PHRASE|$NAME|$COLOR|$HOSTNAME" > {out}.tmp && mv {out}.tmp {out} && exec sleep 300'
        pod = _pod("envy", ["sh", "-c", script], container={"env": env})
        client.post(f"/api/v1/namespaces/{kube_namespace}/pods", json=pod).raise_for_status()
        wait_for(out.exists, what="the container to write its environment")
    assert out.read_text().strip() == "hello world|envy|green|envy"


def test_container_exit_is_reflected_in_status(kube: Kube, kube_namespace: str) -> None:
    with kube.client() as client:
        once = _pod("once", ["sh", "-c", "exit 3"], restartPolicy="Never")
        again = _pod("again", ["sh", "-c", "exit 1"], restartPolicy="Always")
        for pod in (once, again):
            client.post(f"/api/v1/namespaces/{kube_namespace}/pods", json=pod).raise_for_status()

        failed = wait_for(lambda: _pod_when(client, kube_namespace, "once", _phase("Failed")), what="phase Failed")
        assert failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        restarted = wait_for(
            lambda: _pod_when(
                client, kube_namespace, "again", lambda p: p["status"]["containerStatuses"][0]["restartCount"] >= 1
            ),
            what="a restart",
        )
        assert restarted["status"]["phase"] == "Running"
        assert restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 1


def test_deleting_a_pod_kills_every_process_it_started(kube: Kube, kube_namespace: str) -> None:
    marker = f"{kube_namespace[-8:]}"
    child, main = f"sleep 4242.{int(marker, 16)}", f"sleep 4343.{int(marker, 16)}"
    pod = _pod("forks", ["sh", "-c", f"setsid {child} & exec {main}"])
    with kube.client() as client:
        client.post(f"/api/v1/namespaces/{kube_namespace}/pods", json=pod).raise_for_status()
        wait_for(lambda: _processes_with(child) and _processes_with(main), what="both processes")
        client.delete(f"/api/v1/namespaces/{kube_namespace}/pods/forks").raise_for_status()
        wait_for(lambda: _get_pod(client, kube_namespace, "forks") is None, what="the pod to be deleted")
    assert not _processes_with(child)
    assert not _processes_with(main)


def test_replicaset_of_a_sandbox_image_runs_the_executor_and_scales_to_zero(kube: Kube, kube_namespace: str) -> None:
    labels = {"app": "sbx"}
    container = {
        "name": "executor",
        "image": "agent-sandbox/sandbox-base:dev",
        "args": ["--default-user", "root"],
        "readinessProbe": {"httpGet": {"path": "/health", "port": ENVD_PORT}},
    }
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "sbx", "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}},
    }  # fmt: skip
    base = f"/apis/apps/v1/namespaces/{kube_namespace}/replicasets"
    with kube.client() as client:
        client.post(base, json=replicaset).raise_for_status()
        wait_for(lambda: client.get(f"{base}/sbx").json()["status"].get("readyReplicas") == 1, what="1 ready")
        pods = client.get(f"/api/v1/namespaces/{kube_namespace}/pods", params={"labelSelector": "app=sbx"})
        ip = pods.json()["items"][0]["status"]["podIP"]
        assert httpx.get(f"http://{ip}:{ENVD_PORT}/health", trust_env=False).status_code in (200, 204)

        scale = {"spec": {"replicas": 0}}
        headers = {"Content-Type": "application/merge-patch+json"}
        client.patch(f"{base}/sbx/scale", json=scale, headers=headers).raise_for_status()
        wait_for(lambda: not client.get(f"/api/v1/namespaces/{kube_namespace}/pods").json()["items"], what="no pod")
        assert not _accepts(ip, ENVD_PORT)


def test_up_again_is_a_quick_no_op_and_status_says_all_runs(kube: Kube) -> None:
    state = ["--state-dir", str(kube.layout.state_dir)]
    again = subprocess.run([str(SCRIPT), "up", *state], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == str(kube.kubeconfig)
    status = subprocess.run([str(SCRIPT), "status", *state], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout
    assert "node agent-sandbox-dev-node Ready" in status.stdout


def test_down_leaves_no_process_behind(tmp_path: Path) -> None:
    """A second, short-lived cluster with a pod running: after `down` nothing of it is left."""
    require_binaries()
    state = ["--state-dir", str(tmp_path / "kube")]
    up = [str(SCRIPT), "up", *state, "--port", str(free_port()), "--etcd-port", str(free_port_pair())]
    started = subprocess.run(up, capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        kubeconfig = started.stdout.strip().splitlines()[-1]
        pod = '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c",' \
              '"image":"x","command":["sleep","4444.5"]}]}}'  # fmt: skip
        kubectl = [str(Path(SCRIPT).parent.parent / ".venv/bin/kubectl"), "--kubeconfig", kubeconfig]
        subprocess.run([*kubectl, "apply", "-f", "-"], input=pod, text=True, check=True, capture_output=True)
        wait_for(lambda: _processes_with("sleep 4444.5"), what="the pod's process")
    finally:
        stopped = subprocess.run([str(SCRIPT), "down", *state], capture_output=True, text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not _processes_with(str(tmp_path / "kube"))
    assert not _processes_with("sleep 4444.5")
    status = subprocess.run([str(SCRIPT), "status", *state], capture_output=True, text=True, timeout=60)
    assert status.returncode == 3, status.stdout
