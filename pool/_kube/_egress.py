"""A sandbox's own egress rules as a NetworkPolicy of its own, and the pod label that puts it in force.

NetworkPolicies only ever add allows, so a sandbox with rules of its own must leave the policy that lets
every sandbox reach the internet. install.yaml has three for sandbox and warm pods:

    agent-sandbox-sandboxes   every one            ingress from the gateway; egress to DNS only
    agent-sandbox-internet    without egress=own   the internet minus private ranges (E2B's default)
    sandbox-<id>-egress       its sandbox-id       what its rules allow (`allowed_blocks`), created here

The first always selects the pod, so it is isolated for egress whatever else happens: a pod labelled
`egress=own` before its own policy exists (or after it is gone) may resolve names and reach nothing else.
Hence the order: with rules, the policy first and then the label; back to the default, the label off first.
The policy names the sandbox's ReplicaSet as owner, so the garbage collector deletes it with the sandbox.

Only IPs and CIDRs: a NetworkPolicy cannot name a domain. Without an egress guard in the pods (`_guard`),
allowOut domains are refused (`DOMAINS_UNENFORCED`), and enforcement is the CNI's: without a policy-capable
one, every policy here is an object and nothing more. With the guard, the rules hold on any CNI, and the
policies are a second fence where the CNI enforces them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from pool._kube._api import KubeApi, KubeApiError
from pool._kube._calls import delete
from pool._kube._manifest import ObjectMeta, PodList
from pool._kube._pool_manifest import MERGE_PATCH
from pool._kube._shapes import EGRESS_LABEL, EGRESS_ROLE, ID_LABEL, OWN_EGRESS, ROLE_LABEL, egress_policy_name
from pool._runtime import ALL_TRAFFIC, EgressRules

__all__ = ["DOMAINS_UNENFORCED", "PRIVATE_RANGES", "EgressPolicies", "allowed_blocks", "egress_policy"]

DOMAINS_UNENFORCED = (
    "this server's kubernetes runtime cannot enforce allowOut domains (a NetworkPolicy holds IPs and CIDRs only, "
    "and no egress proxy is installed)"
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# What no rule opens, as in install.yaml's agent-sandbox-internet policy (a test holds the two together).
PRIVATE_RANGES: tuple[Network, ...] = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8",
        "fc00::/7", "fe80::/10", "::1/128",
    )
)  # fmt: skip
_pods = msgspec.json.Decoder(PodList)


def allowed_blocks(rules: EgressRules) -> list[dict[str, Any]]:
    """The `ipBlock`s of what `rules` allow: per family, everything but the denied (unless all of it is), plus
    each allowed CIDR; private ranges are cut out of every block, and a block inside one is dropped.

    Rules with domains (which only an egress guard enforces, by the names connections send) allow what the
    default allows: the guard dials what the names resolve to, which no policy can know in advance."""
    if rules.domains:
        rules = EgressRules()
    denied = [_network(entry) for entry in rules.deny_out]
    roots = [ipaddress.ip_network(cidr) for cidr in ALL_TRAFFIC]
    blocks = [_block(root, [*PRIVATE_RANGES, *denied]) for root in roots]
    blocks += [_block(_network(entry), PRIVATE_RANGES) for entry in rules.allow_out]
    return [{"ipBlock": block} for block in blocks if block is not None]


def egress_policy(sandbox_id: str, rules: EgressRules, owner: ObjectMeta) -> dict[str, Any]:
    """The sandbox's own NetworkPolicy, owned by its ReplicaSet `owner`; it allows no DNS (the shared one does)."""
    blocks = allowed_blocks(rules)
    reference = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner.name, "uid": owner.uid}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": egress_policy_name(sandbox_id),
            "labels": {ROLE_LABEL: EGRESS_ROLE, ID_LABEL: sandbox_id},
            "ownerReferences": [reference],
        },
        "spec": {
            "podSelector": {"matchLabels": {ID_LABEL: sandbox_id}},
            "policyTypes": ["Egress"],
            "egress": [{"to": blocks}] if blocks else [],
        },
    }


class EgressPolicies:
    """Creates, replaces and deletes the sandboxes' own policies, and labels their pods to match."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self._api = api
        self._policies = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
        self._pods = f"/api/v1/namespaces/{namespace}/pods"

    async def put(self, sandbox_id: str, rules: EgressRules, owner: ObjectMeta) -> None:
        """Create the sandbox's policy, or replace the rules of the one it has (a merge patch replaces lists)."""
        body = egress_policy(sandbox_id, rules, owner)
        try:
            await self._api.call("POST", self._policies, body=body)
        except KubeApiError as exc:
            if exc.status != 409:
                raise
            url = f"{self._policies}/{egress_policy_name(sandbox_id)}"
            await self._api.call("PATCH", url, body={"spec": body["spec"]}, content_type=MERGE_PATCH)

    async def delete(self, sandbox_id: str) -> None:
        await delete(self._api, f"{self._policies}/{egress_policy_name(sandbox_id)}")

    async def label_pods(self, sandbox_id: str, *, own: bool) -> None:
        """Label (or unlabel) every pod of the sandbox, listed now rather than from a watch: a pod claimed from
        a warm pool a moment ago must not keep the internet its rules take away."""
        listed = await self._api.call("GET", self._pods, params={"labelSelector": f"{ID_LABEL}={sandbox_id}"})
        value = OWN_EGRESS if own else None
        for pod in _pods.decode(listed).items:
            if pod.metadata.labels.get(EGRESS_LABEL) != value:
                await self._label(pod.metadata.name, value)

    async def _label(self, name: str, value: str | None) -> None:
        patch = {"metadata": {"labels": {EGRESS_LABEL: value}}}
        try:
            await self._api.call("PATCH", f"{self._pods}/{name}", body=patch, content_type=MERGE_PATCH)
        except KubeApiError as exc:
            if exc.status != 404:  # gone meanwhile: nothing left to label
                raise


def _network(entry: str) -> Network:
    return ipaddress.ip_network(entry, strict=False)  # an IP is its /32 (/128); the API checked every entry


def _block(cidr: Network, cut: Sequence[Network]) -> dict[str, Any] | None:
    """`cidr` minus the networks of `cut` within it, as an ipBlock; None when one of them covers it all."""
    same = [n for n in cut if n.version == cidr.version]
    if any(cidr.subnet_of(n) for n in same):  # type: ignore[arg-type]  # same family, checked above
        return None
    inside = _collapsed(n for n in same if n.subnet_of(cidr))  # type: ignore[arg-type]
    return {"cidr": str(cidr), **({"except": [str(n) for n in inside]} if inside else {})}


def _collapsed(networks: Iterable[Network]) -> list[Network]:
    return list(ipaddress.collapse_addresses(networks))  # type: ignore[type-var]  # one family: `_block`'s
