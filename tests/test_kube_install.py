"""`install.yaml`: valid against the Kubernetes schemas, applied for real, and its RBAC checked for real.

The schemas are 1.28's and the newest kubernetes-validate ships, checked more strictly than its command does
(`tests.kube_schemas`: a removed API or a deprecated field fails); the objects the runtime creates are checked
against them too. The dev cluster's control plane is 1.20: what it does not serve yet (the PodDisruptionBudget's
policy/v1) is left out of what is applied there, and only the schemas check it.

The gateway's ServiceAccount gets a token through the TokenRequest API, and every right is checked with
that token: SelfSubjectAccessReviews for the whole table of what the gateway needs and must not have, real
calls for each kind of object, and finally the gateway itself (`serve` with the Deployment's args and the
config ConfigMap's environment) on a kubeconfig holding that token alone, driven by the E2B SDK through
create, command, pause (snapshot to zero) and resume, and kill. Each install goes to a namespace of its own,
the RoleBinding's subject namespace edited as the file's header says.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no annotations; only safe_load_all is used
from e2b import Sandbox

from kube_dev._convention import is_sandbox_image
from pool import EgressGuard, EgressRules, ExecutorInit, KubeSettings, SandboxSpec, load_templates
from pool._kube._egress import PRIVATE_RANGES, egress_policy
from pool._kube._manifest import ObjectMeta, replica_set
from pool._kube._pool_manifest import pool_replica_set
from tests import kube_fixtures
from tests.kube_fixtures import Kube
from tests.kube_schemas import OLDEST, problems, schema_versions
from tests.polling import wait_for
from tests.server_fixtures import REPO, free_port, stop_process

kube = kube_fixtures.kube  # the session's cluster (pytest finds fixtures by the names a module binds)

pytestmark = pytest.mark.timeout(180)

INSTALL = REPO / "install.yaml"
GATEWAY_SA = "agent-sandbox-gateway"
SUBJECT_LINE = "    namespace: agent-sandbox  # the install namespace: change it with the namespace\n"
JSON_PATCH = {"Content-Type": "application/merge-patch+json"}
ROLE = "agent-sandbox.dev/role"
# What install.yaml uses that the dev cluster's 1.20 control plane does not serve (policy/v1 is 1.21's).
NEWER_THAN_THE_DEV_CLUSTER = {"policy/v1"}
WARM_READY = "agent-sandbox.dev/warm-ready"


def _documents() -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(INSTALL.read_text()) if doc]


def _object(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"install.yaml has {len(found)} {kind} {name}"
    return found[0]


def _gateway_container() -> dict[str, Any]:
    pod = _object("Deployment", "agent-sandbox-gateway")["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    return container


NEWEST = schema_versions()[-1]


@pytest.mark.parametrize("version", schema_versions())
def test_install_yaml_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    """Strictly (no unknown field), every API still served (a schema for it), nothing deprecated."""
    found = [problem for document in _documents() for problem in problems(document, version)]
    assert not found, "\n".join(found)


_REMOVED_PDB = {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "old"},
                "spec": {"minAvailable": 1}}  # fmt: skip
_REMOVED_INGRESS = {"apiVersion": "extensions/v1beta1", "kind": "Ingress", "metadata": {"name": "old"}}
_ENDPOINTS = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "old"}}


def _pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i"}], **spec}}  # fmt: skip


@pytest.mark.parametrize(
    ("document", "version", "reported"),
    [
        (_REMOVED_PDB, OLDEST, "Couldn't find schema for kind PodDisruptionBudget with api version policy/v1beta1"),
        (_REMOVED_INGRESS, NEWEST, "Couldn't find schema for kind Ingress with api version extensions/v1beta1"),
        (_ENDPOINTS, NEWEST, ".: Endpoints is a collection"),  # "Deprecated: This API is deprecated in v1.33+"
        (_pod(serviceAccount="a"), OLDEST, ".spec.serviceAccount: DeprecatedServiceAccount is a"),
        (_pod(securityContext={"runAsNonRut": True}), OLDEST, "'runAsNonRut' was unexpected"),
    ],
    ids=["removed-api", "removed-api-newest", "deprecated-kind", "deprecated-field", "unknown-field"],
)
def test_the_schema_check_reports_what_the_validator_command_lets_pass(
    document: dict[str, Any], version: str, reported: str
) -> None:
    """All but the unknown field pass `kubernetes-validate --strict` (exit 0; a removed API prints a WARN line)."""
    [problem] = problems(document, version)
    assert reported in problem


@pytest.mark.parametrize("version", schema_versions())
def test_the_runtimes_replica_sets_are_valid_and_run_under_the_default_seccomp_profile(
    version: str, tmp_path: Path
) -> None:
    """Each template's sandbox and warm-pool ReplicaSet, as the runtime builds them for this install."""
    config = _object("ConfigMap", "agent-sandbox-config")["data"]
    account = config["AGENT_SANDBOX_KUBE_SANDBOX_SERVICE_ACCOUNT"]
    guard = EgressGuard(image=config["AGENT_SANDBOX_KUBE_EGRESS_GUARD_IMAGE"], dns_servers=("203.0.113.53",))
    settings = KubeSettings(namespace="ns", service_account=account, guard=guard)
    prefix, args = settings.image_prefix, settings.executor_args
    for template in load_templates(_write_templates(tmp_path)).values():
        spec = SandboxSpec(sandbox_id="abc", template=template, init=ExecutorInit())
        sandbox = replica_set(spec, image_prefix=prefix, executor_args=args, service_account=account, guard=guard)
        pool = pool_replica_set(
            template, 2, image_prefix=prefix, executor_args=args, service_account=account, guard=guard
        )
        for body in (sandbox, pool):
            assert not problems(body, version)
            pod = body["spec"]["template"]["spec"]
            assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
            assert pod["automountServiceAccountToken"] is False
            assert [c["name"] for c in pod["containers"]] == ["egress-guard", "executor"]


def test_a_sandbox_pods_guard_alone_holds_net_admin_and_its_key_reaches_no_other_container() -> None:
    """The executor's container may not mark packets or change the table (no NET_RAW, no NET_ADMIN), and the
    guard's key and state are the guard's: the one Secret reference and the one volume mount are its."""
    template = load_templates(REPO / "templates")["base"]
    guard = EgressGuard(image="agent-sandbox/gateway:0.1.0", denied=("198.51.100.0/24",))
    spec = SandboxSpec(sandbox_id="abc", template=template, init=ExecutorInit())
    pod = replica_set(spec, image_prefix="p-", executor_args=(), guard=guard)["spec"]["template"]["spec"]
    by_name = {c["name"]: c for c in pod["containers"]}
    guard_container, executor = by_name["egress-guard"], by_name["executor"]
    assert guard_container["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "NET_BIND_SERVICE"],
    }
    assert executor["securityContext"]["capabilities"] == {"drop": ["NET_RAW"]}
    assert "add" not in executor["securityContext"]["capabilities"]
    assert "volumeMounts" not in executor
    assert not any("valueFrom" in env for env in executor["env"])
    entry = guard_container["command"][:3]  # the guard's main, SIGTERM handled first (it is its container's PID 1)
    assert entry[2].startswith("import signal, sys; signal.signal(signal.SIGTERM")
    assert entry[2].endswith("from pool._kube._guard import main; main()")
    assert guard_container["command"][3] == "--state-dir=/run/agent-sandbox-guard"
    assert "--denied=198.51.100.0/24" in guard_container["command"]
    assert guard_container["command"][-1] == "--denied=$(AGENT_SANDBOX_NODE_IP)"  # the node is never reached
    assert guard_container["startupProbe"]["tcpSocket"] == {"port": 49982}
    assert "readinessProbe" not in guard_container  # probed until it listens, not for the pod's whole life
    [closer] = pod["initContainers"]  # closes the pod before the executor starts (the kubelet waits for no guard)
    assert closer["command"] == [*entry, "--close"]
    assert closer["securityContext"] == guard_container["securityContext"]
    assert "env" not in closer  # no key: it only closes
    without = replica_set(spec, image_prefix="p-", executor_args=())["spec"]["template"]["spec"]
    assert [c["name"] for c in without["containers"]] == ["executor"]
    assert "volumes" not in without
    assert "initContainers" not in without


@pytest.mark.parametrize("version", schema_versions())
def test_the_runtimes_egress_policies_are_valid(version: str) -> None:
    owner = ObjectMeta(name="sandbox-abc", uid="0f1e2d3c")
    for rules in (
        EgressRules(deny_out=("0.0.0.0/0", "::/0")),
        EgressRules(allow_out=("8.8.8.8",), deny_out=("8.0.0.0/8",)),
    ):
        assert not problems(egress_policy("abc", rules, owner), version)


def test_the_runtime_keeps_private_what_the_install_keeps_private() -> None:
    """A sandbox with rules of its own leaves agent-sandbox-internet: its policy must cut out the same ranges."""
    [rule] = _object("NetworkPolicy", "agent-sandbox-internet")["spec"]["egress"]
    assert {e for peer in rule["to"] for e in peer["ipBlock"]["except"]} == {str(n) for n in PRIVATE_RANGES}
    shared = _object("NetworkPolicy", "agent-sandbox-sandboxes")["spec"]["egress"]
    blocks = [peer["ipBlock"]["cidr"] for rule in shared for peer in rule["to"] if "ipBlock" in peer]
    assert blocks == ["169.254.20.10/32"]  # DNS only: nothing a sandbox's own rules would have to take back


def test_a_node_drain_keeps_a_gateway_replica_serving() -> None:
    budget = _object("PodDisruptionBudget", "agent-sandbox-gateway")["spec"]
    deployment = _object("Deployment", "agent-sandbox-gateway")["spec"]
    assert budget["selector"] == deployment["selector"]
    assert budget["minAvailable"] == 1 < deployment["replicas"]  # one can always be evicted: a drain completes


def test_the_ingress_names_its_class() -> None:
    assert _object("Ingress", "agent-sandbox")["spec"]["ingressClassName"] == "nginx"


_IMAGE_LINE = re.compile(r'^ *(?:- )?image(?:: | = ")([^"\s]+)')  # a container's `image:`, a template's `image =`


def test_every_image_is_pinned_by_digest_or_marked_to_mirror() -> None:
    """Each line naming an image has a digest or a MIRROR comment (the header says how to pin one), and those
    lines name every image of the file: the containers' and the templates'."""
    lines = [line for line in INSTALL.read_text().splitlines() if _IMAGE_LINE.match(line)]
    unmarked = [line for line in lines if "@sha256:" not in line and "MIRROR" not in line.partition("#")[2]]
    assert not unmarked
    pods = [d["spec"]["template"]["spec"] for d in _documents() if d["kind"] == "Deployment"]
    templates = _object("ConfigMap", "agent-sandbox-templates")["data"].values()
    named = [c["image"] for pod in pods for c in pod["containers"]] + [tomllib.loads(t)["image"] for t in templates]
    assert sorted(named) == sorted(match.group(1) for line in lines if (match := _IMAGE_LINE.match(line)))


def test_config_keys_and_deployment_args_are_flags_of_serve() -> None:
    """Each AGENT_SANDBOX_<NAME> of the config ConfigMap is read by `serve` as `--<name>`, and each flag the
    Deployment passes exists (`serve --help` lists them all)."""
    shown = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", shown))
    config = _object("ConfigMap", "agent-sandbox-config")["data"]
    assert config
    for key in config:
        assert key.startswith("AGENT_SANDBOX_"), key
        assert "--" + key.removeprefix("AGENT_SANDBOX_").lower().replace("_", "-") in flags, f"{key}: no such flag"
    args = _gateway_container()["args"]
    assert args[0] == "serve"
    assert {arg for arg in args if arg.startswith("--")} <= flags


def test_templates_configmap_matches_the_repository_templates(tmp_path: Path) -> None:
    """The ConfigMap's templates are the repository's plus `image`, which names a sandbox image, and `freeze_only`
    for the desktop and the browser, which the kubernetes runtime could only snapshot without their processes;
    and they load."""
    data: dict[str, str] = _object("ConfigMap", "agent-sandbox-templates")["data"]
    assert sorted(data) == sorted(p.name for p in (REPO / "templates").glob("*.toml"))
    for name, text in data.items():
        template = tomllib.loads(text)
        image = template.pop("image")
        stem = name.removesuffix(".toml").removeprefix("sandbox-")
        assert image.startswith(f"agent-sandbox/sandbox-{stem}:")
        assert is_sandbox_image(image)
        assert template.pop("freeze_only", False) == (stem in ("desktop", "browser")), name
        assert template == tomllib.loads((REPO / "templates" / name).read_text()), name
    loaded = load_templates(_write_templates(tmp_path))
    shipped = load_templates(REPO / "templates")
    assert {name: msgspec.structs.replace(t, image="", freeze_only=False) for name, t in loaded.items()} == shipped
    assert all(is_sandbox_image(t.image) for t in loaded.values())


def _write_templates(directory: Path) -> Path:
    """The templates ConfigMap's files in `directory`/templates, as its volume mount shows them to the gateway."""
    templates = directory / "templates"
    templates.mkdir()
    for name, text in _object("ConfigMap", "agent-sandbox-templates")["data"].items():
        (templates / name).write_text(text)
    return templates


@contextlib.contextmanager
def _install(kube: Kube) -> Iterator[str]:
    """`kubectl create namespace NS && kubectl apply -n NS -f install.yaml`; the namespace."""
    namespace = f"agent-sandbox-{secrets.token_hex(3)}"
    assert INSTALL.read_text().count(SUBJECT_LINE) == 1
    kube.kubectl("create", "namespace", namespace)
    try:
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=_applicable(kube, namespace))
        yield namespace
    finally:
        kube.kubectl("delete", "namespace", namespace, "--wait=false")


@pytest.fixture(scope="module")
def installed(kube: Kube) -> Iterator[str]:
    with _install(kube) as namespace:
        yield namespace


def _applicable(kube: Kube, namespace: str) -> str:
    """install.yaml for `namespace`, without the objects of API versions this cluster does not serve, each of
    which must be one of `NEWER_THAN_THE_DEV_CLUSTER`."""
    with kube.client() as admin:
        groups = admin.get("/apis").json()["groups"]
    served = {"v1"} | {version["groupVersion"] for group in groups for version in group["versions"]}
    text = INSTALL.read_text().replace(SUBJECT_LINE, SUBJECT_LINE.replace("agent-sandbox ", f"{namespace} ", 1))
    kept = []
    for chunk in text.split("\n---\n"):
        api_version = (yaml.safe_load(chunk) or {}).get("apiVersion")
        if api_version is None or api_version in served:
            kept.append(chunk)
        else:
            assert api_version in NEWER_THAN_THE_DEV_CLUSTER, f"the cluster does not serve {api_version}"
    return "\n---\n".join(kept)


def _token(kube: Kube, namespace: str, account: str) -> str:
    """A token for the ServiceAccount from the TokenRequest API, as the kubelet gets one for a pod."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 900}}
    with kube.client() as admin:
        response = admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", json=request)
    response.raise_for_status()
    token: str = response.json()["status"]["token"]
    return token


@pytest.fixture(scope="module")
def gateway(kube: Kube, installed: str) -> Iterator[httpx.Client]:
    """An API client that holds only the gateway ServiceAccount's token."""
    with kube.client(_token(kube, installed, GATEWAY_SA)) as client:
        yield client


def _allowed(client: httpx.Client, attributes: dict[str, str]) -> bool:
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attributes}}  # fmt: skip
    response = client.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=review)
    response.raise_for_status()
    return bool(response.json()["status"].get("allowed"))


def _rule(verb: str, group: str, resource: str, subresource: str = "", name: str = "") -> dict[str, str]:
    return {"verb": verb, "group": group, "resource": resource, "subresource": subresource, "name": name}


NEEDED = [  # every verb the gateway's code sends (grep `api.call(` and `api.watch(`), and no other
    *(_rule(v, "apps", "replicasets") for v in ("get", "list", "watch", "create", "patch", "delete")),
    _rule("update", "apps", "replicasets", "finalizers"),  # blockOwnerDeletion on archive Secrets
    *(_rule(v, "", "pods") for v in ("get", "list", "watch", "patch", "delete")),
    *(_rule(v, "", "secrets") for v in ("list", "create")),
    *(_rule(v, "", "secrets", name="sandbox-abc-record") for v in ("get", "update", "delete")),
    *(_rule(v, "", "secrets", name="sandbox-abc-archive-0") for v in ("get", "delete")),
    *(_rule(v, "", "secrets", name="agent-sandbox-keys") for v in ("get", "update")),
    *(_rule(v, "", "secrets", name="agent-sandbox-api-key") for v in ("get", "patch")),
    *(_rule(v, "networking.k8s.io", "networkpolicies") for v in ("create", "patch", "delete")),  # `_egress`
    _rule("create", "coordination.k8s.io", "leases"),
    *(_rule(v, "coordination.k8s.io", "leases", name="agent-sandbox-leader") for v in ("get", "update")),
]

DENIED_HERE = [
    _rule("create", "", "pods", "exec"),
    _rule("get", "", "pods", "exec"),
    _rule("create", "", "pods", "attach"),
    _rule("create", "", "pods", "portforward"),
    _rule("create", "", "pods", "eviction"),
    _rule("get", "", "pods", "log"),
    _rule("create", "", "pods"),
    _rule("update", "", "pods"),
    _rule("update", "", "pods", "status"),
    _rule("deletecollection", "", "pods"),
    _rule("update", "apps", "replicasets"),
    _rule("update", "apps", "replicasets", "scale"),
    _rule("patch", "apps", "replicasets", "scale"),
    _rule("update", "apps", "replicasets", "status"),
    _rule("deletecollection", "apps", "replicasets"),
    _rule("watch", "", "secrets"),
    _rule("patch", "", "secrets", name="sandbox-abc-record"),
    _rule("patch", "", "secrets", name="agent-sandbox-tls"),
    _rule("deletecollection", "", "secrets"),
    _rule("list", "coordination.k8s.io", "leases"),
    _rule("get", "coordination.k8s.io", "leases", name="some-other-lease"),
    _rule("update", "coordination.k8s.io", "leases", name="some-other-lease"),
    _rule("patch", "coordination.k8s.io", "leases", name="agent-sandbox-leader"),
    _rule("delete", "coordination.k8s.io", "leases", name="agent-sandbox-leader"),
    _rule("get", "", "configmaps", name="agent-sandbox-templates"),
    _rule("list", "", "configmaps"),
    _rule("create", "", "configmaps"),
    _rule("create", "", "persistentvolumeclaims"),
    _rule("get", "", "persistentvolumeclaims"),
    _rule("create", "", "events"),
    _rule("create", "", "serviceaccounts", "token"),
    _rule("create", "", "services"),
    _rule("create", "apps", "deployments"),
    _rule("patch", "apps", "deployments"),
    _rule("create", "rbac.authorization.k8s.io", "roles"),
    _rule("create", "rbac.authorization.k8s.io", "rolebindings"),
    _rule("update", "rbac.authorization.k8s.io", "roles", name="agent-sandbox-gateway"),
    _rule("update", "networking.k8s.io", "networkpolicies"),
    _rule("deletecollection", "networking.k8s.io", "networkpolicies"),
]

DENIED_ELSEWHERE = [  # (namespace, rule): other namespaces, all namespaces (""), and cluster-scoped objects
    ("default", _rule("list", "", "pods")),
    ("default", _rule("create", "apps", "replicasets")),
    ("default", _rule("create", "", "secrets")),
    ("default", _rule("list", "", "secrets")),
    ("kube-system", _rule("get", "", "configmaps")),
    ("kube-system", _rule("get", "", "secrets", name="agent-sandbox-api-key")),
    ("kube-system", _rule("get", "coordination.k8s.io", "leases", name="agent-sandbox-leader")),
    ("", _rule("list", "", "pods")),
    ("", _rule("list", "", "secrets")),
    ("", _rule("list", "apps", "replicasets")),
    ("", _rule("list", "", "nodes")),
    ("", _rule("list", "", "namespaces")),
    ("", _rule("list", "", "persistentvolumes")),
    ("", _rule("create", "rbac.authorization.k8s.io", "clusterroles")),
    ("", _rule("create", "rbac.authorization.k8s.io", "clusterrolebindings")),
]


def _describe(rule: dict[str, str]) -> str:
    resource = "/".join(filter(None, (rule["group"], rule["resource"], rule["subresource"])))
    return f"{rule['verb']} {resource}" + (f" {rule['name']}" if rule["name"] else "")


@pytest.mark.parametrize("rule", NEEDED, ids=_describe)
def test_gateway_account_may_do_what_the_gateway_needs(
    gateway: httpx.Client, installed: str, rule: dict[str, str]
) -> None:
    assert _allowed(gateway, {"namespace": installed, **rule})


@pytest.mark.parametrize("rule", DENIED_HERE, ids=_describe)
def test_gateway_account_may_not_do_more_in_its_namespace(
    gateway: httpx.Client, installed: str, rule: dict[str, str]
) -> None:
    assert not _allowed(gateway, {"namespace": installed, **rule})


@pytest.mark.parametrize(
    ("namespace", "rule"), DENIED_ELSEWHERE, ids=lambda x: _describe(x) if isinstance(x, dict) else x or "*"
)
def test_gateway_account_has_no_rights_elsewhere(gateway: httpx.Client, namespace: str, rule: dict[str, str]) -> None:
    assert not _allowed(gateway, {"namespace": namespace, **rule} if namespace else rule)


def test_gateway_token_works_for_real_on_every_kind_it_uses(gateway: httpx.Client, installed: str) -> None:
    ns = f"/api/v1/namespaces/{installed}"
    _exercise_leases(gateway, f"/apis/coordination.k8s.io/v1/namespaces/{installed}/leases")
    sets = f"/apis/apps/v1/namespaces/{installed}/replicasets"
    owner = _exercise_replicasets_and_pods(gateway, installed)
    _exercise_secrets(gateway, ns, owner)
    _exercise_network_policies(gateway, installed, owner)
    assert gateway.delete(f"{sets}/sandbox-rbac1", params={"propagationPolicy": "Background"}).status_code == 200

    pod = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "x", "image": "x"}]}}
    assert gateway.post(f"{ns}/pods", json=pod).status_code == 403
    assert gateway.get(f"{ns}/configmaps/agent-sandbox-templates").status_code == 403
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    assert (
        gateway.post(f"{ns}/persistentvolumeclaims", json={"metadata": {"name": "fs"}, "spec": claim}).status_code
        == 403
    )
    assert gateway.get(f"{ns}/secrets", params={"watch": "1", "timeoutSeconds": "1"}).status_code == 403
    assert gateway.get("/api/v1/nodes").status_code == 403
    assert gateway.get("/api/v1/namespaces/default/pods").status_code == 403
    assert gateway.get("/api/v1/namespaces/default/secrets").status_code == 403


def _exercise_leases(client: httpx.Client, leases: str) -> None:
    """As `pool._kube._leader`: create, read, renew under the resourceVersion; a stale write loses with 409."""
    lease = {"metadata": {"name": "agent-sandbox-leader"},
             "spec": {"holderIdentity": "gateway-a", "leaseDurationSeconds": 15}}  # fmt: skip
    created = client.post(leases, json=lease)
    assert created.status_code == 201, created.text
    assert client.get(f"{leases}/agent-sandbox-leader").json()["spec"]["holderIdentity"] == "gateway-a"
    renewed = created.json()
    renewed["spec"]["holderIdentity"] = "gateway-b"
    assert client.put(f"{leases}/agent-sandbox-leader", json=renewed).status_code == 200
    stale = client.put(f"{leases}/agent-sandbox-leader", json=created.json())
    assert stale.status_code == 409  # a replica that lost the race learns it from the resourceVersion
    assert client.delete(f"{leases}/agent-sandbox-leader").status_code == 403
    assert client.get(leases).status_code == 403


def _exercise_replicasets_and_pods(client: httpx.Client, namespace: str) -> dict[str, Any]:
    """Create a sandbox-like ReplicaSet at 0, patch it to 1, claim its pod as a warm-pool claim does (labels
    and ownerReferences under the resourceVersion), delete the pod; the ReplicaSet as last read."""
    labels = {"agent-sandbox.dev/sandbox-id": "rbac1"}
    container = {"name": "executor", "image": "agent-sandbox/gateway:not-runnable"}  # stays Waiting, runs nothing
    template = {"metadata": {"labels": labels}, "spec": {"containers": [container]}}
    replicaset = {"metadata": {"name": "sandbox-rbac1", "labels": labels},
                  "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": template}}  # fmt: skip
    sets = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    assert client.post(sets, json=replicaset).status_code == 201
    scale = {"metadata": {"annotations": {"agent-sandbox.dev/snapshot": None}}, "spec": {"replicas": 1}}
    assert client.patch(f"{sets}/sandbox-rbac1", json=scale, headers=JSON_PATCH).status_code == 200
    assert client.get(sets, params={"watch": "1", "timeoutSeconds": "1"}).status_code == 200
    assert (
        client.patch(f"{sets}/sandbox-rbac1/scale", json={"spec": {"replicas": 1}}, headers=JSON_PATCH).status_code
        == 403
    )

    pods = f"/api/v1/namespaces/{namespace}/pods"
    selector = {"labelSelector": "agent-sandbox.dev/sandbox-id=rbac1"}
    pod = wait_for(lambda: client.get(pods, params=selector).json()["items"], what="the ReplicaSet's pod")[0]
    name = pod["metadata"]["name"]
    assert client.get(pods, params={**selector, "watch": "1", "timeoutSeconds": "1"}).status_code == 200
    claim = {"metadata": {"resourceVersion": pod["metadata"]["resourceVersion"], "ownerReferences": None,
                          "labels": {"agent-sandbox.dev/sandbox-id": "claimed"}}}  # fmt: skip
    assert client.patch(f"{pods}/{name}", json=claim, headers=JSON_PATCH).status_code == 200
    assert client.patch(f"{pods}/{name}", json=claim, headers=JSON_PATCH).status_code == 409  # claimed already
    assert client.delete(f"{pods}/{name}").status_code == 200
    found: dict[str, Any] = client.get(f"{sets}/sandbox-rbac1").json()
    return found


def _exercise_secrets(client: httpx.Client, ns: str, owner: dict[str, Any]) -> None:
    """As `activator._kube_store` and `pool._kube._archive`: a record created, listed by label, replaced under
    its resourceVersion and deleted under a precondition; an archive chunk owned by the sandbox's ReplicaSet."""
    path = f"{ns}/secrets"
    record = {"metadata": {"name": "sandbox-rbac1-record", "labels": {ROLE: "sandbox-record"}},
              "type": "agent-sandbox.dev/record", "data": {"record": _b64("{}")}}  # fmt: skip
    created = client.post(path, json=record)
    assert created.status_code == 201, created.text
    listed = client.get(path, params={"labelSelector": f"{ROLE}=sandbox-record"}).json()["items"]
    assert [s["metadata"]["name"] for s in listed] == ["sandbox-rbac1-record"]
    replaced = client.put(f"{path}/sandbox-rbac1-record", json={**created.json(), "data": {"record": _b64("[]")}})
    assert replaced.status_code == 200
    assert client.put(f"{path}/sandbox-rbac1-record", json=created.json()).status_code == 409
    assert client.patch(f"{path}/sandbox-rbac1-record", json={"data": {}}, headers=JSON_PATCH).status_code == 403
    precondition = {"kind": "DeleteOptions", "apiVersion": "v1",
                    "preconditions": {"resourceVersion": replaced.json()["metadata"]["resourceVersion"]}}  # fmt: skip
    assert client.request("DELETE", f"{path}/sandbox-rbac1-record", json=precondition).status_code == 200

    reference = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner["metadata"]["name"],
                 "uid": owner["metadata"]["uid"], "controller": False, "blockOwnerDeletion": True}  # fmt: skip
    chunk = {"metadata": {"name": "sandbox-rbac1-archive-0", "labels": {ROLE: "sandbox-archive"},
                          "ownerReferences": [reference]}, "data": {"archive": _b64("tar.gz")}}  # fmt: skip
    assert client.post(path, json=chunk).status_code == 201
    assert client.get(f"{path}/sandbox-rbac1-archive-0").json()["data"]["archive"] == _b64("tar.gz")
    assert client.delete(f"{path}/sandbox-rbac1-archive-0").status_code == 200


def _exercise_network_policies(client: httpx.Client, namespace: str, owner: dict[str, Any]) -> None:
    """As `pool._kube._egress`: a sandbox's own policy created, its rules replaced with a patch, deleted."""
    policies = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies"
    meta = ObjectMeta(name=owner["metadata"]["name"], uid=owner["metadata"]["uid"])
    policy = egress_policy("rbac1", EgressRules(deny_out=("0.0.0.0/0", "::/0")), meta)
    assert client.post(policies, json=policy).status_code == 201
    opened = egress_policy("rbac1", EgressRules(), meta)["spec"]
    patched = client.patch(f"{policies}/sandbox-rbac1-egress", json={"spec": opened}, headers=JSON_PATCH)
    assert patched.status_code == 200
    assert len(patched.json()["spec"]["egress"][0]["to"]) == 2  # the lists replaced, not merged
    assert client.put(f"{policies}/sandbox-rbac1-egress", json=patched.json()).status_code == 403
    assert client.delete(f"{policies}/sandbox-rbac1-egress").status_code == 200


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_api_key_secret_is_empty_filled_once_and_kept_by_reapply(
    kube: Kube, gateway: httpx.Client, installed: str
) -> None:
    path = f"/api/v1/namespaces/{installed}/secrets/agent-sandbox-api-key"
    empty = gateway.get(path)
    assert empty.status_code == 200
    assert not empty.json().get("data"), "install.yaml must ship no API key"

    key = "e2b_" + secrets.token_hex(16)
    version = empty.json()["metadata"]["resourceVersion"]
    filled = {"metadata": {"resourceVersion": version}, "data": {"api-key": _b64(key)}}  # as `gateway._key_secret`
    assert gateway.patch(path, json=filled, headers=JSON_PATCH).status_code == 200
    racing = {"metadata": {"resourceVersion": version}, "data": {"api-key": _b64("e2b_" + "0" * 32)}}
    assert gateway.patch(path, json=racing, headers=JSON_PATCH).status_code == 409  # the first replica's key stays

    output = kube.kubectl("apply", "-n", installed, "-f", "-", input=_applicable(kube, installed))
    assert "secret/agent-sandbox-api-key unchanged" in output or "secret/agent-sandbox-api-key configured" in output
    assert base64.b64decode(gateway.get(path).json()["data"]["api-key"]).decode() == key


def test_reapplying_changes_nothing(kube: Kube, installed: str) -> None:
    output = kube.kubectl("apply", "-n", installed, "-f", "-", input=_applicable(kube, installed))
    lines = output.strip().splitlines()
    assert lines
    assert all(line.endswith(" unchanged") for line in lines if "agent-sandbox-api-key" not in line), output


def test_gateway_deployment_is_hardened_and_replicated(kube: Kube, installed: str) -> None:
    with kube.client() as admin:
        deployment = admin.get(f"/apis/apps/v1/namespaces/{installed}/deployments/agent-sandbox-gateway").json()
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert spec["replicas"] >= 2
    assert pod["serviceAccountName"] == GATEWAY_SA
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]
    assert container["args"][:7] == ["serve", "--runtime", "kubernetes", "--namespace", "$(POD_NAMESPACE)",
                                     "--redis-url", "redis://agent-sandbox-redis:6379"]  # fmt: skip
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}  # POD_NAME: the replica id
    assert container["envFrom"] == [{"configMapRef": {"name": "agent-sandbox-config"}}]


def test_sandbox_account_has_no_rights_and_no_token_mounted(kube: Kube, installed: str) -> None:
    with kube.client() as admin:
        account = admin.get(f"/api/v1/namespaces/{installed}/serviceaccounts/agent-sandbox-sandbox").json()
    assert account["automountServiceAccountToken"] is False
    with kube.client(_token(kube, installed, "agent-sandbox-sandbox")) as sandbox:
        for rule in (_rule("list", "", "pods"), _rule("get", "", "configmaps"), _rule("get", "", "secrets"),
                     _rule("list", "", "secrets"), _rule("get", "coordination.k8s.io", "leases")):  # fmt: skip
            assert not _allowed(sandbox, {"namespace": installed, **rule})


# The gateway for real, on the ServiceAccount's token alone -----------------------------------------------------


@pytest.fixture(scope="module")
def gateway_namespace(kube: Kube) -> Iterator[str]:
    """An install of its own: the gateway fills in its empty API-key Secret."""
    with _install(kube) as namespace:
        yield namespace


def _service_account_kubeconfig(kube: Kube, namespace: str, directory: Path) -> Path:
    """A kubeconfig whose only credential is a token of the gateway's ServiceAccount."""
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "gateway",
        "clusters": [{"name": "dev", "cluster": {"server": kube.layout.server,
                                                 "certificate-authority": str(kube.layout.pki / "ca.crt")}}],
        "users": [{"name": GATEWAY_SA, "user": {"token": _token(kube, namespace, GATEWAY_SA)}}],
        "contexts": [{"name": "gateway", "context": {"cluster": "dev", "user": GATEWAY_SA, "namespace": namespace}}],
    }  # fmt: skip
    path = directory / "kubeconfig"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _gateway_argv(namespace: str, port: int, kubeconfig: Path, directory: Path) -> list[str]:
    """The Deployment's args, for this machine: no Redis (one replica), its namespace, a local port, the templates
    ConfigMap's files; plus the dev cluster's needs (a kubeconfig instead of the pod's account, root sandboxes), a
    warm pod (its pool's ReplicaSet, warming and claim are calls too) and a lease renewed every second."""
    args = list(_gateway_container()["args"])
    at = args.index("--redis-url")
    del args[at : at + 2]
    here = {"$(POD_NAMESPACE)": namespace, "0.0.0.0": "127.0.0.1", "3000": str(port),
            "/etc/agent-sandbox/templates": str(_write_templates(directory))}  # fmt: skip
    assert set(here) <= set(args), args
    return [
        sys.executable, "-m", "cli", *(here.get(arg, arg) for arg in args),
        "--kubeconfig", str(kubeconfig),
        "--kube-sandbox-user", "root", "--data-dir", str(directory / "data"), "--warm", "base=1",
        "--lease-duration", "3",
    ]  # fmt: skip


@contextlib.contextmanager
def _serving(argv: list[str], env: dict[str, str], log: Path, url: str) -> Iterator[None]:
    """Run the gateway until the block ends (`tests.server_fixtures.running_server` wants the key in the data
    directory; here it is in the Secret)."""
    with log.open("w") as out:
        process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:

            def healthy() -> bool:
                if process.poll() is not None:
                    pytest.fail(f"the gateway exited with {process.returncode}:\n{log.read_text()}")
                with contextlib.suppress(httpx.TransportError):
                    return httpx.get(f"{url}/health", timeout=1).status_code == 200
                return False

            wait_for(healthy, what="the gateway to answer /health", within=90)
            yield
        finally:
            stop_process(process)


def _warm_ready_pods(admin: httpx.Client, ns: str) -> list[str]:
    pods = admin.get(f"{ns}/pods", params={"labelSelector": f"{ROLE}=warm"}).json()["items"]
    return [p["metadata"]["name"] for p in pods if p["metadata"].get("annotations", {}).get(WARM_READY) == "true"]


def _renewed_by(lease: dict[str, Any], holder: str) -> bool:
    spec = lease["spec"]
    return bool(spec["holderIdentity"] == holder and spec["renewTime"] != spec["acquireTime"])


@pytest.mark.timeout(300)
def test_the_gateway_runs_on_its_service_account_alone(
    kube: Kube, gateway_namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every call `serve --runtime kubernetes` makes for a sandbox's life (API key, records, leader lease, a warm
    pool and the claim of its pod, the sandbox's ReplicaSet, the snapshot's archive Secrets, resume, kill) passes
    this Role: nothing is forbidden."""
    namespace, port = gateway_namespace, free_port()
    url = f"http://127.0.0.1:{port}"
    kubeconfig = _service_account_kubeconfig(kube, namespace, tmp_path)
    config = _object("ConfigMap", "agent-sandbox-config")["data"]  # envFrom, as in the Deployment
    # But no egress guard: the stand-in kubelet never runs a container that adds capabilities. The real node's
    # install test (tests/test_kube_real_node_install.py) runs install.yaml with it.
    config = {name: value for name, value in config.items() if name != "AGENT_SANDBOX_KUBE_EGRESS_GUARD_IMAGE"}
    env = {**os.environ, **config, "POD_NAMESPACE": namespace, "POD_NAME": "agent-sandbox-gateway-0",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    log = tmp_path / "gateway.log"
    with kube.client() as admin, _serving(_gateway_argv(namespace, port, kubeconfig, tmp_path), env, log, url):
        ns, sets = f"/api/v1/namespaces/{namespace}", f"/apis/apps/v1/namespaces/{namespace}/replicasets"
        stored = admin.get(f"{ns}/secrets/{config['AGENT_SANDBOX_API_KEY_SECRET']}").json()["data"]["api-key"]
        key = base64.b64decode(stored).decode()
        assert re.fullmatch(r"e2b_[0-9a-f]{32}", key)
        for name, value in {"E2B_API_KEY": key, "E2B_API_URL": url, "E2B_SANDBOX_URL": url}.items():
            monkeypatch.setenv(name, value)

        wait_for(lambda: _warm_ready_pods(admin, ns), what="a warm pod of template base", within=90)
        sbx = Sandbox.create(timeout=120)
        try:
            selector = {"labelSelector": f"agent-sandbox.dev/sandbox-id={sbx.sandbox_id}"}
            [pod] = admin.get(f"{ns}/pods", params=selector).json()["items"]
            assert pod["metadata"]["labels"]["agent-sandbox.dev/claimed-from"] == "base"  # the warm pod, claimed
            assert sbx.commands.run("echo hello; id -un").stdout.split() == ["hello", "root"]
            workdir = sbx.commands.run("pwd").stdout.strip()
            sbx.files.write(f"{workdir}/kept.txt", "survives the snapshot")
            pod_spec = admin.get(f"{sets}/sandbox-{sbx.sandbox_id}").json()["spec"]["template"]["spec"]
            assert pod_spec["automountServiceAccountToken"] is False
            assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}  # the pool's
            assert pod["spec"]["serviceAccountName"] == "agent-sandbox-sandbox"  # no RoleBinding names it

            assert sbx.pause()
            assert admin.get(f"{sets}/sandbox-{sbx.sandbox_id}").json()["spec"]["replicas"] == 0
            archive = {"labelSelector": f"{ROLE}=sandbox-archive,agent-sandbox.dev/sandbox-id={sbx.sandbox_id}"}
            assert admin.get(f"{ns}/secrets", params=archive).json()["items"]

            resumed = Sandbox.connect(sbx.sandbox_id, timeout=120)
            assert resumed.files.read(f"{workdir}/kept.txt") == "survives the snapshot"
            assert admin.get(f"{sets}/sandbox-{sbx.sandbox_id}").json()["spec"]["replicas"] == 1
            lease = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/agent-sandbox-leader"
            wait_for(lambda: _renewed_by(admin.get(lease).json(), "agent-sandbox-gateway-0"), what="a lease renewal")
        finally:
            sbx.kill()
        wait_for(lambda: admin.get(f"{sets}/sandbox-{sbx.sandbox_id}").status_code == 404, what="the ReplicaSet to go")
        record = admin.get(f"{ns}/secrets/sandbox-{sbx.sandbox_id}-record").json()
        assert record["metadata"]["labels"]["agent-sandbox.dev/state"] == "killed"
    output = log.read_text()
    assert "forbidden" not in output.lower(), output  # a 403 anywhere, the background loops' included
