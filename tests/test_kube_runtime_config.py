"""Finding the apiserver: kubeconfig files (YAML or JSON, tokens, client certificates) and the in-cluster convention."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import httpx
import pytest
import trustme

from pool import RuntimeFailure
from pool._kube import in_cluster, load_kubeconfig
from pool._kube._connection import TokenFileAuth


def _kubeconfig(path: Path, user: str, cluster: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: dev\n"
        "contexts:\n- name: dev\n  context: {cluster: c, user: u, namespace: sandboxes}\n"
        f"clusters:\n- name: c\n  cluster: {cluster}\n"
        f"users:\n- name: u\n  user: {user}\n"
    )
    return path


def test_a_yaml_kubeconfig_gives_server_token_namespace_and_inline_ca(tmp_path: Path) -> None:
    ca = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    cluster = f"{{server: 'https://10.0.0.1:6443/', certificate-authority-data: {ca}}}"
    connection = load_kubeconfig(_kubeconfig(tmp_path / "config", "{token: abc}", cluster))
    assert (connection.server, connection.token, connection.namespace) == ("https://10.0.0.1:6443", "abc", "sandboxes")


def test_client_certificates_and_ca_files_are_read_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    client = ca.issue_cert("agent-sandbox")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.crt"))
    client.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    user = "{client-certificate: client.crt, client-key: client.key}"
    connection = load_kubeconfig(
        _kubeconfig(tmp_path / "config", user, "{server: 'https://k', certificate-authority: ca.crt}")
    )
    assert connection.token is None
    assert connection.verify.cert_store_stats()["x509_ca"] == 1


def test_exec_plugins_and_missing_contexts_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure, match="exec or auth-provider plugin"):
        load_kubeconfig(_kubeconfig(tmp_path / "a", "{exec: {command: aws}}", "{server: 'https://k'}"))
    with pytest.raises(RuntimeFailure, match="no context named 'other'"):
        load_kubeconfig(_kubeconfig(tmp_path / "b", "{token: t}", "{server: 'https://k'}"), context="other")
    with pytest.raises(RuntimeFailure, match="cannot use kubeconfig"):
        load_kubeconfig(tmp_path / "missing")


def test_in_cluster_reads_the_service_account_and_needs_the_service_host(tmp_path: Path) -> None:
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    (tmp_path / "token").write_text("sa-token\n")
    (tmp_path / "namespace").write_text("agent-sandbox")
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    connection = in_cluster(environ, tmp_path)
    assert (connection.server, connection.token_file, connection.namespace) == (
        "https://[fd00::1]:443", tmp_path / "token", "agent-sandbox"
    )  # fmt: skip
    with pytest.raises(RuntimeFailure, match="not running in a Kubernetes pod"):
        in_cluster({}, tmp_path)


def test_a_rotated_service_account_token_is_read_again(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    auth = TokenFileAuth(token)
    assert next(auth.auth_flow(httpx.Request("GET", "https://k"))).headers["Authorization"] == "Bearer first"
    token.write_text("second")
    os.utime(token, (1, 1))  # a new mtime, as the kubelet's atomic swap gives
    assert next(auth.auth_flow(httpx.Request("GET", "https://k"))).headers["Authorization"] == "Bearer second"
