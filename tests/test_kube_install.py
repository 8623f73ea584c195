"""`install.yaml`: valid against the Kubernetes schemas, applied for real, and its RBAC checked for real.

The gateway's ServiceAccount gets a token through the TokenRequest API, and every right is checked with
that token: SelfSubjectAccessReviews for the whole table of what the gateway needs and must not have, then
real calls for each kind of object. The install goes to a namespace of its own, the RoleBinding's subject
namespace edited as the file's header says.
"""

from __future__ import annotations

import base64
import importlib.util
import secrets
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pool._kube_dev._convention import is_sandbox_image
from tests import kube_fixtures
from tests.kube_fixtures import Kube, wait_for
from tests.server_fixtures import REPO

kube = kube_fixtures.kube  # the session's cluster (pytest finds fixtures by the names a module binds)

pytestmark = pytest.mark.timeout(180)

INSTALL = REPO / "install.yaml"
GATEWAY_SA = "agent-sandbox-gateway"
SUBJECT_LINE = "    namespace: agent-sandbox  # the install namespace: change it with the namespace\n"
JSON_PATCH = {"Content-Type": "application/merge-patch+json"}


def _schema_versions() -> list[str]:
    """1.28 (the oldest supported) and the newest version whose schemas kubernetes-validate ships."""
    spec = importlib.util.find_spec("kubernetes_validate")
    assert spec is not None, "kubernetes-validate is not installed"
    assert spec.submodule_search_locations
    schemas = Path(next(iter(spec.submodule_search_locations))) / "kubernetes-json-schema"
    versions = [d.name.removeprefix("v").removesuffix("-local") for d in schemas.glob("v*-local")]
    newest = max(versions, key=lambda v: tuple(int(part) for part in v.split(".")))
    return ["1.28.0", newest]


@pytest.mark.parametrize("version", _schema_versions())
def test_install_yaml_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    validate = REPO / ".venv" / "bin" / "kubernetes-validate"
    result = subprocess.run(
        [str(validate), "--kubernetes-version", version, "--strict", "--quiet", str(INSTALL)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def installed(kube: Kube) -> Iterator[str]:
    """`kubectl create namespace NS && kubectl apply -n NS -f install.yaml`; the namespace."""
    namespace = f"agent-sandbox-{secrets.token_hex(3)}"
    text = INSTALL.read_text()
    assert text.count(SUBJECT_LINE) == 1
    kube.kubectl("create", "namespace", namespace)
    try:
        kube.kubectl("apply", "-n", namespace, "-f", "-", input=_in_namespace(text, namespace))
        yield namespace
    finally:
        kube.kubectl("delete", "namespace", namespace, "--wait=false")


def _in_namespace(text: str, namespace: str) -> str:
    return text.replace(SUBJECT_LINE, SUBJECT_LINE.replace("agent-sandbox ", f"{namespace} ", 1))


def _token(kube: Kube, namespace: str, account: str) -> str:
    """A token for the ServiceAccount from the TokenRequest API, as the kubelet gets one for a pod."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
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


NEEDED = [
    *(_rule(v, "apps", "replicasets") for v in ("get", "list", "watch", "create", "update", "patch", "delete")),
    *(_rule(v, "apps", "replicasets", "scale") for v in ("get", "update", "patch")),
    _rule("update", "apps", "replicasets", "finalizers"),
    *(_rule(v, "", "pods") for v in ("get", "list", "watch", "patch", "delete")),
    *(_rule(v, "", "configmaps") for v in ("get", "list", "watch", "create", "update", "patch", "delete")),
    *(_rule(v, "coordination.k8s.io", "leases") for v in ("get", "list", "watch", "create", "update", "delete")),
    *(_rule(v, "", "persistentvolumeclaims") for v in ("get", "list", "watch", "create", "patch", "delete")),
    *(_rule(v, "", "secrets", name="agent-sandbox-api-key") for v in ("get", "update", "patch")),
    _rule("create", "", "events"),
    _rule("patch", "", "events"),
]

DENIED_HERE = [
    _rule("create", "", "pods", "exec"),
    _rule("get", "", "pods", "exec"),
    _rule("create", "", "pods", "attach"),
    _rule("create", "", "pods", "portforward"),
    _rule("get", "", "pods", "log"),
    _rule("create", "", "pods"),
    _rule("update", "", "pods", "status"),
    _rule("list", "", "secrets"),
    _rule("get", "", "secrets", name="some-other-secret"),
    _rule("create", "", "secrets"),
    _rule("delete", "", "secrets", name="agent-sandbox-api-key"),
    _rule("create", "", "serviceaccounts", "token"),
    _rule("create", "", "services"),
    _rule("create", "apps", "deployments"),
    _rule("patch", "apps", "deployments"),
    _rule("create", "rbac.authorization.k8s.io", "roles"),
    _rule("create", "rbac.authorization.k8s.io", "rolebindings"),
    _rule("update", "rbac.authorization.k8s.io", "roles", name="agent-sandbox-gateway"),
    _rule("create", "networking.k8s.io", "networkpolicies"),
    _rule("deletecollection", "", "pods"),
]

DENIED_ELSEWHERE = [  # (namespace, rule): other namespaces, all namespaces (""), and cluster-scoped objects
    ("default", _rule("list", "", "pods")),
    ("default", _rule("create", "apps", "replicasets")),
    ("kube-system", _rule("get", "", "configmaps")),
    ("kube-system", _rule("get", "", "secrets", name="agent-sandbox-api-key")),
    ("", _rule("list", "", "pods")),
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
    _exercise_configmaps_and_events(gateway, ns)
    _exercise_leases(gateway, f"/apis/coordination.k8s.io/v1/namespaces/{installed}/leases")
    pod = _exercise_replicasets_and_pods(gateway, installed)
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    pvc = gateway.post(f"{ns}/persistentvolumeclaims", json={"metadata": {"name": "sbx-fs"}, "spec": claim})
    assert pvc.status_code == 201, pvc.text
    assert gateway.delete(f"{ns}/persistentvolumeclaims/sbx-fs").status_code == 200

    assert gateway.post(f"{ns}/pods/{pod}/exec", params={"command": "id", "stdout": "true"}).status_code == 403
    assert gateway.get("/api/v1/nodes").status_code == 403
    assert gateway.get("/api/v1/namespaces/default/pods").status_code == 403
    assert gateway.get(f"{ns}/secrets").status_code == 403
    assert gateway.post(f"{ns}/pods", json={"metadata": {"name": "x"}, "spec": {}}).status_code == 403


def _exercise_configmaps_and_events(client: httpx.Client, ns: str) -> None:
    created = client.post(f"{ns}/configmaps", json={"metadata": {"name": "sbx-state"}, "data": {"a": "1"}})
    assert created.status_code == 201, created.text
    patch = {"data": {"a": "2"}}
    assert client.patch(f"{ns}/configmaps/sbx-state", json=patch, headers=JSON_PATCH).status_code == 200
    assert client.get(f"{ns}/configmaps", params={"watch": "1", "timeoutSeconds": "1"}).status_code == 200
    assert client.get(f"{ns}/configmaps/agent-sandbox-templates").json()["data"]
    event = {
        "metadata": {"generateName": "sbx-"},
        "involvedObject": {"kind": "ConfigMap", "name": "sbx-state", "namespace": ns.rsplit("/", 1)[1]},
        "reason": "Paused", "message": "sandbox paused", "type": "Normal", "source": {"component": "agent-sandbox"},
    }  # fmt: skip
    assert client.post(f"{ns}/events", json=event).status_code == 201
    assert client.delete(f"{ns}/configmaps/sbx-state").status_code == 200


def _exercise_leases(client: httpx.Client, leases: str) -> None:
    lease = {"metadata": {"name": "agent-sandbox-leader"},
             "spec": {"holderIdentity": "gateway-a", "leaseDurationSeconds": 15}}  # fmt: skip
    created = client.post(leases, json=lease)
    assert created.status_code == 201, created.text
    renewed = created.json()
    renewed["spec"]["holderIdentity"] = "gateway-b"
    assert client.put(f"{leases}/agent-sandbox-leader", json=renewed).status_code == 200
    stale = client.put(f"{leases}/agent-sandbox-leader", json=created.json())
    assert stale.status_code == 409  # a replica that lost the race learns it from the resourceVersion
    assert client.delete(f"{leases}/agent-sandbox-leader").status_code == 200


def _exercise_replicasets_and_pods(client: httpx.Client, namespace: str) -> str:
    """Create a sandbox-like ReplicaSet at 0, scale it to 1, claim its pod by re-labelling; the pod's name."""
    labels = {"agent-sandbox.dev/sandbox": "rbac1"}
    container = {"name": "executor", "image": "agent-sandbox/gateway:not-runnable"}  # stays Waiting, runs nothing
    template = {"metadata": {"labels": labels}, "spec": {"containers": [container]}}
    replicaset = {"metadata": {"name": "sbx-rbac1", "labels": labels},
                  "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": template}}  # fmt: skip
    sets = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    assert client.post(sets, json=replicaset).status_code == 201
    assert (
        client.patch(f"{sets}/sbx-rbac1/scale", json={"spec": {"replicas": 1}}, headers=JSON_PATCH).status_code == 200
    )
    assert client.get(f"{sets}/sbx-rbac1/scale").json()["spec"]["replicas"] == 1
    annotate = {"metadata": {"annotations": {"agent-sandbox.dev/state": "running"}}}
    assert client.patch(f"{sets}/sbx-rbac1", json=annotate, headers=JSON_PATCH).status_code == 200

    pods = f"/api/v1/namespaces/{namespace}/pods"
    selector = {"labelSelector": "agent-sandbox.dev/sandbox=rbac1"}
    pod = wait_for(lambda: client.get(pods, params=selector).json()["items"], what="the ReplicaSet's pod")[0]
    name = pod["metadata"]["name"]
    assert client.get(pods, params={**selector, "watch": "1", "timeoutSeconds": "1"}).status_code == 200
    relabel = {"metadata": {"labels": {"agent-sandbox.dev/sandbox": "claimed"}}}
    assert client.patch(f"{pods}/{name}", json=relabel, headers=JSON_PATCH).status_code == 200
    assert client.delete(f"{pods}/{name}").status_code == 200
    assert client.delete(f"{sets}/sbx-rbac1").status_code == 200
    return str(name)


def test_api_key_secret_is_empty_filled_once_and_kept_by_reapply(
    kube: Kube, gateway: httpx.Client, installed: str
) -> None:
    path = f"/api/v1/namespaces/{installed}/secrets/agent-sandbox-api-key"
    empty = gateway.get(path)
    assert empty.status_code == 200
    assert not empty.json().get("data"), "install.yaml must ship no API key"

    key = "e2b_" + secrets.token_hex(16)
    filled = {**empty.json(), "data": {"api-key": base64.b64encode(key.encode()).decode()}}
    assert gateway.put(path, json=filled).status_code == 200
    racing = {**empty.json(), "data": {"api-key": base64.b64encode(b"e2b_" + b"0" * 32).decode()}}
    assert gateway.put(path, json=racing).status_code == 409  # the second replica keeps the first one's key

    output = kube.kubectl("apply", "-n", installed, "-f", "-", input=_in_namespace(INSTALL.read_text(), installed))
    assert "secret/agent-sandbox-api-key unchanged" in output or "secret/agent-sandbox-api-key configured" in output
    assert base64.b64decode(gateway.get(path).json()["data"]["api-key"]).decode() == key


def test_reapplying_changes_nothing(kube: Kube, installed: str) -> None:
    output = kube.kubectl("apply", "-n", installed, "-f", "-", input=_in_namespace(INSTALL.read_text(), installed))
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


def test_sandbox_account_has_no_rights_and_no_token_mounted(kube: Kube, installed: str) -> None:
    with kube.client() as admin:
        account = admin.get(f"/api/v1/namespaces/{installed}/serviceaccounts/agent-sandbox-sandbox").json()
    assert account["automountServiceAccountToken"] is False
    with kube.client(_token(kube, installed, "agent-sandbox-sandbox")) as sandbox:
        for rule in (_rule("list", "", "pods"), _rule("get", "", "configmaps"), _rule("get", "", "secrets")):
            assert not _allowed(sandbox, {"namespace": installed, **rule})


def test_templates_configmap_matches_the_repository_templates(kube: Kube, installed: str) -> None:
    with kube.client() as admin:
        data: dict[str, Any] = admin.get(f"/api/v1/namespaces/{installed}/configmaps/agent-sandbox-templates").json()[
            "data"
        ]
    assert sorted(data) == sorted(p.name for p in (REPO / "templates").glob("*.toml"))
    for name, text in data.items():
        template = tomllib.loads(text)
        image = template.pop("image")
        stem = name.removesuffix(".toml").removeprefix("sandbox-")
        assert image.startswith(f"agent-sandbox/sandbox-{stem}:")
        assert is_sandbox_image(image)
        assert template == tomllib.loads((REPO / "templates" / name).read_text()), name
