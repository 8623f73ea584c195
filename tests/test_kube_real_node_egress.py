"""E2B's egress rules on the real node, whose CNI (the plain bridge plugin) enforces no NetworkPolicy: the
egress guard in each sandbox pod (`--kube-egress-guard-image`, the gateway's image) is what holds them.

The test internet of `tests.internet_fixtures` is attached to the node's own network namespace (its router
answers 203.0.113.16/28, 198.51.100.0/24 and DNS for `*.egress.test`); nothing leaves the machine, and the
node's namespace has no other route out.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import ALL_TRAFFIC, Sandbox

from tests import real_node_fixtures
from tests.internet_fixtures import DNS_SERVER, OTHER_IP, WEB_IP, Internet, made_internet
from tests.polling import wait_for
from tests.real_node_fixtures import RealNode, gateway_on_node, install_templates
from tests.server_fixtures import RunningServer, point_e2b_at
from tests.test_kube_real_node import _sandbox_pod

real_node, namespace = real_node_fixtures.real_node, real_node_fixtures.namespace

pytestmark = pytest.mark.timeout(300)

GUARD_IMAGE = "agent-sandbox/gateway:0.1.0"
CURL_CANNOT_CONNECT, CURL_RESET = 7, 56


@pytest.fixture(scope="module")
def node_internet(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    into_node = real_node.in_namespace()
    # Forwarding in the node's namespace alone (the bridge plugin turns it on too): the pods' way to the router.
    subprocess.run([*into_node, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    with made_internet(tmp_path_factory.mktemp("node-internet"), host=into_node) as net:
        yield net


@pytest.fixture(scope="module")
def server(
    real_node: RealNode, namespace: str, node_internet: Internet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("real-node-egress")
    args = ["--namespace", namespace, "--templates", str(install_templates(directory / "templates")),
            "--kube-egress-guard-image", GUARD_IMAGE, "--sandbox-dns", DNS_SERVER, "--warm", "base=1"]  # fmt: skip
    with gateway_on_node(real_node, directory / "data", *args) as server:
        yield server


@pytest.fixture
def made(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Sandbox]]:
    point_e2b_at(server, monkeypatch)
    sandboxes: list[Sandbox] = []
    yield sandboxes
    for sbx in sandboxes:
        sbx.kill()


def _created(made: list[Sandbox], **options: Any) -> Sandbox:
    made.append(Sandbox.create(timeout=120, **options))
    return made[-1]


def _reaches(sbx: Sandbox, url: str, answer: str) -> bool:
    """Whether curl fetches `url`; a failure must be a refused (or, for a name, reset) connection, not a hang."""
    result = sbx.commands.run(f"curl -sSk --max-time 30 {url}; echo exit=$?")
    if result.stdout.endswith((f"exit={CURL_CANNOT_CONNECT}\n", f"exit={CURL_RESET}\n")):
        return False
    assert result.stdout == f"hello from {answer}\nexit=0\n", result
    return True


def test_a_default_sandbox_reaches_the_internet_through_its_pods_guard(
    real_node: RealNode, namespace: str, made: list[Sandbox]
) -> None:
    sbx = _created(made)
    assert _reaches(sbx, f"http://{WEB_IP}/", WEB_IP)
    assert _reaches(sbx, "https://web.egress.test/", WEB_IP)  # resolved by the guard's forwarder, then dialled
    pod = _sandbox_pod(real_node, namespace, sbx.sandbox_id)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["egress-guard", "executor"]
    assert pod["spec"]["containers"][0]["image"] == GUARD_IMAGE


def test_allow_internet_access_false_and_cidr_rules_hold_without_a_policy_cni(made: list[Sandbox]) -> None:
    offline = _created(made, allow_internet_access=False)
    assert not _reaches(offline, f"http://{WEB_IP}/", WEB_IP)
    assert not _reaches(offline, f"http://{OTHER_IP}/", OTHER_IP)
    denied = _created(made, network={"deny_out": ["203.0.113.16/28"]})
    assert not _reaches(denied, f"http://{WEB_IP}/", WEB_IP)
    assert _reaches(denied, f"http://{OTHER_IP}/", OTHER_IP)


def test_a_claimed_warm_pod_gets_the_callers_rules_before_the_caller_gets_it(
    real_node: RealNode, namespace: str, made: list[Sandbox]
) -> None:
    """A warm pod ran its template's start commands closed; the claim puts the create's rules in force."""
    wait_for(lambda: _warm_ready(real_node, namespace), what="a warm pod of template base", within=120)
    sbx = _created(made, network={"deny_out": [f"{WEB_IP}/32"]})
    pod = _sandbox_pod(real_node, namespace, sbx.sandbox_id)
    assert pod["metadata"]["labels"]["agent-sandbox.dev/claimed-from"] == "base"
    assert not _reaches(sbx, f"http://{WEB_IP}/", WEB_IP)
    assert _reaches(sbx, f"http://{OTHER_IP}/", OTHER_IP)


def _warm_ready(node: RealNode, namespace: str) -> bool:
    pods = json.loads(node.kube.kubectl("get", "pods", "-n", namespace, "-l", "agent-sandbox.dev/role=warm", "-o",
                                        "json"))["items"]  # fmt: skip
    return any(p["metadata"].get("annotations", {}).get("agent-sandbox.dev/warm-ready") == "true" for p in pods)


def test_allow_out_domains_are_enforced_by_the_name_each_connection_sends(made: list[Sandbox]) -> None:
    sbx = _created(made, network={"allow_out": ["web.egress.test"], "deny_out": [ALL_TRAFFIC]})
    assert _reaches(sbx, "http://web.egress.test/", WEB_IP)
    assert _reaches(sbx, "https://web.egress.test/", WEB_IP)
    assert not _reaches(sbx, "http://other.egress.test/", OTHER_IP)
    assert not _reaches(sbx, f"http://{OTHER_IP}/", OTHER_IP)


def test_update_network_replaces_the_rules_in_the_running_pod_and_a_resume_keeps_them(made: list[Sandbox]) -> None:
    sbx = _created(made)
    assert _reaches(sbx, f"http://{WEB_IP}/", WEB_IP)
    sbx.update_network({"deny_out": [ALL_TRAFFIC]})
    assert not _reaches(sbx, f"http://{WEB_IP}/", WEB_IP)
    sbx.update_network({"deny_out": [f"{WEB_IP}/32"]})
    assert _reaches(sbx, f"http://{OTHER_IP}/", OTHER_IP)
    assert sbx.pause()  # to zero: the new pod starts closed, and gets the rules before anything runs in it
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=120)
    assert not _reaches(resumed, f"http://{WEB_IP}/", WEB_IP)
    assert _reaches(resumed, f"http://{OTHER_IP}/", OTHER_IP)


def test_root_in_a_sandbox_can_neither_pass_as_its_guard_nor_reach_the_node(
    real_node: RealNode, made: list[Sandbox]
) -> None:
    sbx = _created(made, network={"deny_out": [ALL_TRAFFIC]})
    marked = "python3 -c 'import socket; socket.socket().setsockopt(socket.SOL_SOCKET, socket.SO_MARK, 0x1d0a)'"
    result = sbx.commands.run(f"sudo {marked} 2>&1; echo exit=$?")
    assert "Operation not permitted" in result.stdout, result
    bounding = int(sbx.commands.run("sudo grep CapBnd /proc/self/status").stdout.split()[1], 16)
    net_admin, net_raw = 1 << 12, 1 << 13
    assert bounding & (net_admin | net_raw) == 0
    assert not _reaches(sbx, f"http://{WEB_IP}/", WEB_IP)
    open_one = _created(made)
    kubelet = open_one.commands.run(f"curl -sk -m 10 https://{real_node.kube.layout.node_ip}:10250/pods; echo exit=$?")
    assert kubelet.stdout.endswith((f"exit={CURL_CANNOT_CONNECT}\n", f"exit={CURL_RESET}\n")), kubelet
