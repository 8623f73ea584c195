"""The kubernetes runtime on a real node: a real kubelet + containerd + runc running the images buildah built from
deploy/Dockerfile.* (`scripts/kube-dev-cluster up --real-node`), driven by the real `e2b` SDK.

What the stand-in kubelet cannot prove: that the images work as images (their ENTRYPOINT, Debian's Python 3.11.2,
the `user` account), that sandboxes run as uid 1000 (no `--kube-sandbox-user root` here) under the runtime's
seccomp profile with their limits enforced and no ServiceAccount token, that an OOM is an OOM, and that a
snapshot to zero resumes in a new pod (the resume bug of shared/reference/k8s-real-node.md §4 was found here).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from kube_dev._control_plane import load_layout
from kube_dev._real_node import containerd_socket
from tests import real_node_fixtures
from tests.kube_fixtures import SCRIPT, Kube, free_port_pair, live_pods
from tests.polling import wait_for
from tests.real_node_fixtures import (
    SYSCTLS_AT_START,
    RealNode,
    gateway_on_node,
    install_templates,
    machine_sysctls,
    new_namespace,
    require_real_node,
)
from tests.scale_to_zero_fixtures import sandboxes_by_state
from tests.server_fixtures import RunningServer, free_port, point_e2b_at

real_node, namespace = real_node_fixtures.real_node, real_node_fixtures.namespace

pytestmark = pytest.mark.timeout(300)

ROLE = "agent-sandbox.dev/role"
SANDBOX_IMAGE = "docker.io/agent-sandbox/sandbox-base:0.1.0"


@pytest.fixture(scope="module")
def server(real_node: RealNode, namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("real-node-gateway")
    args = ["--namespace", namespace, "--templates", str(install_templates(directory / "templates")), "--warm",
            "base=1"]  # fmt: skip
    with gateway_on_node(real_node, directory / "data", *args) as server:
        yield server


@pytest.fixture(autouse=True)
def e2b_env(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> None:
    point_e2b_at(server, monkeypatch)


def _pods(node: RealNode, namespace: str, selector: str) -> list[dict[str, Any]]:
    raw = node.kube.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(raw)["items"]
    return items


def _sandbox_pod(node: RealNode, namespace: str, sandbox_id: str) -> dict[str, Any]:
    running = [
        p for p in _pods(node, namespace, f"agent-sandbox.dev/sandbox-id={sandbox_id}")
        if not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    assert len(running) == 1, [p["metadata"]["name"] for p in running]
    return running[0]


def _status_of(sbx: Sandbox, path: str) -> dict[str, str]:
    fields = (line.split(":", 1) for line in sbx.commands.run(f"cat {path}").stdout.splitlines() if ":" in line)
    return {key: value.strip() for key, value in fields}


def _memory_limit(sbx: Sandbox) -> int:
    """The limit of the container's memory cgroup, cgroup v1 or v2 (the pod sees only its own)."""
    script = "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
    return int(sbx.commands.run(script).stdout.split()[0])


def test_a_sandbox_is_the_images_entrypoint_as_uid_1000_under_seccomp_with_its_limits_and_no_token(
    real_node: RealNode, namespace: str
) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        assert sbx.commands.run("id -u; id -un; pwd").stdout.split() == ["1000", "user", "/home/user"]
        entrypoint = sbx.commands.run("tr '\\0' ' ' < /proc/1/cmdline").stdout.split()
        assert entrypoint[:4] == ["/usr/bin/python3", "-I", "-S", "/opt/agent-sandbox/run-executor.py"]
        assert sbx.commands.run("/usr/bin/python3 -V").stdout.strip() == "Python 3.11.2"  # Debian 12's, not ours
        status = _status_of(sbx, "/proc/self/status")
        assert status["Seccomp"] == "2"  # the runtime's RuntimeDefault profile, filtering
        assert _memory_limit(sbx) == 1024 * 2**20  # the template's memory_mb
        assert sbx.commands.run("ls /var/run/secrets/kubernetes.io 2>&1 || true").stdout.count("No such file") == 1
        pod = _sandbox_pod(real_node, namespace, sbx.sandbox_id)
        assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(real_node.kube.layout.pod_cidr)
        assert pod["spec"]["containers"][0]["image"] == "agent-sandbox/sandbox-base:0.1.0"
        [container] = pod["status"]["containerStatuses"]
        assert container["image"] == SANDBOX_IMAGE
        assert container["imageID"].startswith("sha256:")
        assert pod["spec"]["nodeName"] == real_node.kube.layout.node_name  # scheduled by kube-scheduler
    finally:
        sbx.kill()


def test_a_sandbox_reaches_the_nodes_apis_but_may_do_nothing_there(real_node: RealNode) -> None:
    """The node's address is reachable from pods (in-cluster clients dial the apiserver there): the kubelet takes
    no anonymous caller (else any sandbox could exec into any other), and the apiserver gives one nothing."""
    layout = real_node.kube.layout
    sbx = Sandbox.create(timeout=120)
    try:
        status = "curl -sk -o /dev/null -w '%{http_code}' -m 10"
        kubelet = sbx.commands.run(f"{status} https://{layout.node_ip}:10250/pods").stdout
        assert kubelet == "401"
        apiserver = sbx.commands.run(f"{status} https://{layout.node_ip}:{layout.apiserver_port}/api/v1/pods").stdout
        assert apiserver == "403"
    finally:
        sbx.kill()


def test_an_allocation_past_the_memory_limit_is_an_oom_kill_of_that_command_alone() -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        with pytest.raises(CommandExitException) as killed:
            sbx.commands.run("python3 -c 'b = bytearray(1536 * 2**20); b[::4096] = b\"x\" * (len(b) // 4096)'")
        assert killed.value.error == "signal: killed"  # envd's words for a SIGKILL, the OOM killer's
        counters = sbx.commands.run(
            "cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null || cat /sys/fs/cgroup/memory.events"
        ).stdout
        assert int(dict(line.split() for line in counters.splitlines())["oom_kill"]) >= 1
        assert sbx.commands.run("echo still here").stdout == "still here\n"  # the executor was not the victim
    finally:
        sbx.kill()


def test_pause_scales_to_zero_and_connect_resumes_in_a_new_pod_with_the_files(
    real_node: RealNode, namespace: str
) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "survives the snapshot")
        sbx.commands.run("mkdir -p /home/user/deep/er && echo nested > /home/user/deep/er/file && chmod 640 "
                         "/home/user/deep/er/file")  # fmt: skip
        first = _sandbox_pod(real_node, namespace, sbx.sandbox_id)["metadata"]["uid"]
        assert sbx.pause()
        assert live_pods(real_node.kube, namespace, sbx.sandbox_id) == []  # pause returns once nothing of it runs
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=120)
        assert resumed.files.read("/home/user/kept.txt") == "survives the snapshot"
        listing = resumed.commands.run("stat -c '%U %a' /home/user/deep/er/file; cat /home/user/deep/er/file")
        assert listing.stdout.split() == ["user", "640", "nested"]
        assert _sandbox_pod(real_node, namespace, sbx.sandbox_id)["metadata"]["uid"] != first
    finally:
        sbx.kill()


def test_a_create_claims_a_warm_pod_of_the_image(real_node: RealNode, namespace: str) -> None:
    def warm_ready() -> list[dict[str, Any]]:
        pods = _pods(real_node, namespace, f"{ROLE}=warm")
        return [p for p in pods if p["metadata"].get("annotations", {}).get("agent-sandbox.dev/warm-ready") == "true"]

    wait_for(warm_ready, what="a warm pod of template base", within=120)
    sbx = Sandbox.create(timeout=120)
    try:
        pod = _sandbox_pod(real_node, namespace, sbx.sandbox_id)
        assert pod["metadata"]["labels"]["agent-sandbox.dev/claimed-from"] == "base"
        assert sbx.commands.run("id -un").stdout == "user\n"
    finally:
        sbx.kill()


def test_an_idle_sandbox_is_snapshotted_to_zero_and_woken_by_a_request(real_node: RealNode, tmp_path: Path) -> None:
    namespace = new_namespace(real_node)
    args = ["--namespace", namespace, "--templates", str(install_templates(tmp_path / "templates")),
            "--pause-after", "2", "--snapshot-after", "6"]  # fmt: skip
    try:
        with gateway_on_node(real_node, tmp_path / "data", *args) as server:
            sbx = Sandbox.create(timeout=200, api_key=server.api_key, api_url=server.url, sandbox_url=server.url)
            try:
                sbx.files.write("idle.txt", "kept while idle")
                wait_for(lambda: sandboxes_by_state(server).get("snapshotted") == 1, what="the idle snapshot")
                assert live_pods(real_node.kube, namespace, sbx.sandbox_id) == []
                woke = httpx.get(
                    f"{server.url}/health", headers={"Host": f"49983-{sbx.sandbox_id}.sandbox.localhost"}, timeout=90
                )
                assert woke.status_code == 204  # held while a new pod started, then answered by it
                assert sbx.files.read("idle.txt") == "kept while idle"
            finally:
                sbx.kill()
    finally:
        real_node.kube.kubectl("delete", "namespace", namespace, "--wait=false")


def _machine_state() -> dict[str, object]:
    """What a real node must leave as it found it: links, the kernel tunables the kubelet wants, mounts, CNI's cache."""
    cni_results = Path("/var/lib/cni/results")
    return {
        "links": sorted(p.name for p in Path("/sys/class/net").iterdir()),
        "sysctls": machine_sysctls(),
        "mounts": sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()),
        "cni": sorted(p.name for p in cni_results.iterdir()) if cni_results.is_dir() else [],
    }


def _processes_naming(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if text in cmdline:
                    found.append(f"{proc.name}: {cmdline}")
    return found


def test_a_real_node_leaves_nothing_behind_when_it_goes_down(tmp_path: Path) -> None:
    require_real_node()
    before = _machine_state()
    state = tmp_path / "cluster"
    ports = ["--port", str(free_port()), "--etcd-port", str(free_port_pair())]
    up = subprocess.run([str(SCRIPT), "up", "--real-node", "--state-dir", str(state), *ports], capture_output=True,
                        text=True, timeout=600)  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr[-4000:]
        kube = Kube(load_layout(state), state / "admin.kubeconfig")
        kube.kubectl("run", "leftover", "--image", "agent-sandbox/sandbox-base:0.1.0", "--restart", "Never")
        wait_for(lambda: kube.kubectl("get", "pod", "leftover", "-o", "jsonpath={.status.phase}") == "Running",
                 what="a pod running on the node")  # fmt: skip
        assert _processes_naming(str(state))  # its daemons and the pod's shim run
    finally:
        down = subprocess.run([str(SCRIPT), "down", "--state-dir", str(state)], capture_output=True, timeout=300)
    assert down.returncode == 0, down.stderr
    assert _processes_naming(str(state)) == []  # no daemon or container of it
    assert _processes_naming(str(containerd_socket(kube.layout))) == []  # no shim (they name the socket)
    cgroup_name = kube.layout.cgroup_name
    assert [str(d) for d in Path("/sys/fs/cgroup").glob(f"*/{cgroup_name}")] == []  # v1 hierarchies and unified
    assert not Path(f"/sys/fs/cgroup/{cgroup_name}").exists()
    assert _machine_state() == before
    # `before` was taken with this session's own real node up (this module's gateway runs on it): the tunables
    # are held to what the machine had before any node ran.
    assert machine_sysctls() == SYSCTLS_AT_START
