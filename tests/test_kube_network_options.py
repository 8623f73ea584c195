"""The network options on `serve --runtime kubernetes`, through the real `e2b` SDK: IP and CIDR egress rules become
a NetworkPolicy of the sandbox's own (and a label that takes its pod out of install.yaml's internet policy);
allowOut domains are refused with a 400, never a silent 201; private ports and the Host mask are the gateway's
and work as locally.

The dev cluster's stand-in kubelet enforces no policy: these tests check the objects, not the traffic."""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2b import ALL_TRAFFIC, Sandbox
from e2b.exceptions import SandboxException

from pool import EgressRules
from pool._kube._egress import allowed_blocks
from tests import kube_fixtures
from tests.kube_fixtures import Kube
from tests.polling import wait_for
from tests.test_kube_runtime_e2b import e2b_env, namespace, server

kube = kube_fixtures.kube
__all__ = ["e2b_env", "kube", "namespace", "server"]  # the module-scoped server of the kube E2B tests, reused

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

REFUSAL = "400: this server's kubernetes runtime cannot enforce allowOut domains"
EGRESS_LABEL = "agent-sandbox.dev/egress"
V4_PRIVATE = ["10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"]
V6_DEFAULT = {"cidr": "::/0", "except": ["::1/128", "fc00::/7", "fe80::/10"]}


def _policy(kube: Kube, namespace: str, sandbox_id: str) -> dict[str, Any] | None:
    found = json.loads(kube.kubectl("get", "networkpolicy", "-n", namespace, "-o", "json"))["items"]
    mine = [p for p in found if p["metadata"]["name"] == f"sandbox-{sandbox_id}-egress"]
    return mine[0] if mine else None


def _labels(kube: Kube, namespace: str, sandbox_id: str) -> tuple[str | None, list[str | None]]:
    """The egress label of the sandbox's pod template and of each of its pods."""
    selector = f"agent-sandbox.dev/sandbox-id={sandbox_id}"
    rs = json.loads(kube.kubectl("get", "replicaset", f"sandbox-{sandbox_id}", "-n", namespace, "-o", "json"))
    pods = json.loads(kube.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json"))["items"]
    template = rs["spec"]["template"]["metadata"]["labels"].get(EGRESS_LABEL)
    return template, [pod["metadata"]["labels"].get(EGRESS_LABEL) for pod in pods]


def _blocks(policy: dict[str, Any] | None) -> list[dict[str, Any]]:
    assert policy is not None, "the sandbox has no NetworkPolicy of its own"
    return [peer["ipBlock"] for rule in policy["spec"].get("egress", []) for peer in rule["to"]]


def _sorted(block: dict[str, Any]) -> dict[str, Any]:
    return {**block, **({"except": sorted(block["except"])} if "except" in block else {})}


def test_allow_beats_deny_beats_the_default_and_private_ranges_stay_out() -> None:
    rules = EgressRules(allow_out=("203.0.113.7", "10.1.0.0/16", "8.0.0.0/6"), deny_out=("203.0.113.0/24",))
    blocks = [_sorted(b["ipBlock"]) for b in allowed_blocks(rules)]
    assert blocks == [
        {"cidr": "0.0.0.0/0", "except": sorted([*V4_PRIVATE, "203.0.113.0/24"])},
        V6_DEFAULT,
        {"cidr": "203.0.113.7/32"},  # the allowed IP inside the denied range
        {"cidr": "8.0.0.0/6", "except": ["10.0.0.0/8"]},  # 10.1.0.0/16 is private: dropped
    ]


def test_denying_all_traffic_leaves_only_what_is_allowed() -> None:
    assert allowed_blocks(EgressRules(deny_out=("0.0.0.0/0", "::/0"))) == []
    only = EgressRules(allow_out=("198.51.100.0/24",), deny_out=("0.0.0.0/0", "::/0"))
    assert allowed_blocks(only) == [{"ipBlock": {"cidr": "198.51.100.0/24"}}]


def test_no_internet_is_a_policy_owned_by_the_replica_set_and_a_labelled_pod(kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(timeout=60, allow_internet_access=False)
    try:
        policy = _policy(kube, namespace, sbx.sandbox_id)
        assert policy is not None
        assert policy["spec"]["podSelector"] == {"matchLabels": {"agent-sandbox.dev/sandbox-id": sbx.sandbox_id}}
        assert policy["spec"]["policyTypes"] == ["Egress"]
        assert _blocks(policy) == []  # DNS comes from install.yaml's shared policy, which still selects the pod
        [owner] = policy["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("ReplicaSet", f"sandbox-{sbx.sandbox_id}")
        assert _labels(kube, namespace, sbx.sandbox_id) == ("own", ["own"])
        assert sbx.commands.run("echo ok").stdout == "ok\n"
    finally:
        sbx.kill()
    wait_for(lambda: _policy(kube, namespace, sbx.sandbox_id) is None, what="the garbage collector to take it")


def test_cidr_rules_become_ip_blocks(kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(timeout=60, network={"allow_out": ["203.0.113.7"], "deny_out": ["203.0.113.0/24"]})
    try:
        assert [_sorted(b) for b in _blocks(_policy(kube, namespace, sbx.sandbox_id))] == [
            {"cidr": "0.0.0.0/0", "except": sorted([*V4_PRIVATE, "203.0.113.0/24"])},
            V6_DEFAULT,
            {"cidr": "203.0.113.7/32"},
        ]
    finally:
        sbx.kill()


def test_domains_are_refused_not_ignored() -> None:
    with pytest.raises(SandboxException, match=REFUSAL):
        Sandbox.create(timeout=60, network={"allow_out": ["example.com"], "deny_out": [ALL_TRAFFIC]})


def test_update_network_replaces_the_policy_and_the_default_removes_it(kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(timeout=60, network={"allow_public_traffic": False})
    try:
        assert sbx.traffic_access_token
        assert _policy(kube, namespace, sbx.sandbox_id) is None
        assert _labels(kube, namespace, sbx.sandbox_id) == (None, [None])
        sbx.update_network({"deny_out": [ALL_TRAFFIC]})
        assert _blocks(_policy(kube, namespace, sbx.sandbox_id)) == []
        assert _labels(kube, namespace, sbx.sandbox_id) == ("own", ["own"])
        sbx.update_network({"allow_out": ["198.51.100.0/24"], "deny_out": [ALL_TRAFFIC]})
        assert _blocks(_policy(kube, namespace, sbx.sandbox_id)) == [{"cidr": "198.51.100.0/24"}]
        with pytest.raises(SandboxException, match=REFUSAL):
            sbx.update_network({"allow_out": ["example.com"], "deny_out": [ALL_TRAFFIC]})
        sbx.update_network({})
        assert _policy(kube, namespace, sbx.sandbox_id) is None
        assert _labels(kube, namespace, sbx.sandbox_id) == (None, [None])
        assert sbx.get_info().network == {"allow_public_traffic": False}
    finally:
        sbx.kill()


def test_rules_changed_while_paused_hold_in_the_resumed_pod(kube: Kube, namespace: str) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        assert sbx.pause()
        sbx.update_network({"deny_out": [ALL_TRAFFIC]})
        Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert _blocks(_policy(kube, namespace, sbx.sandbox_id)) == []
        assert _labels(kube, namespace, sbx.sandbox_id) == ("own", ["own"])
    finally:
        sbx.kill()
