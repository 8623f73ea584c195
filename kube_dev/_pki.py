"""Certificates, keys and tokens of the dev cluster, made once per state dir with the `openssl` CLI.

Clients authenticate with static bearer tokens (`--token-auth-file`) rather than client certificates:
one file, and tests can read a token without parsing PEM. The service-account key pair is what makes the
TokenRequest API and the controller-manager's token controller work.
"""

from __future__ import annotations

import csv
import secrets
import subprocess
from pathlib import Path

import msgspec

from kube_dev._layout import ClusterLayout

__all__ = ["USERS", "ensure_pki", "read_token", "write_kubeconfigs"]

# user name → (groups, kubeconfig file stem). system:kube-controller-manager gets its rights from RBAC's
# bootstrap policy; the stand-in kubelet binds pods (the scheduler's job) too, so it is an admin.
USERS: dict[str, tuple[str, str]] = {
    "agent-sandbox-admin": ("system:masters", "admin"),
    "system:kube-controller-manager": ("", "controller-manager"),
    "agent-sandbox-dev-kubelet": ("system:masters", "kubelet"),
}

_SERVER_NAMES = (
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
    "DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1"
)


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _make_ca_and_server_cert(pki: Path, node_ip: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
        "-subj", "/CN=agent-sandbox-dev-ca", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=pki,
    )  # fmt: skip
    # A real node's pods reach the apiserver at the node's address (there is no kube-proxy for 10.0.0.1).
    _sign(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        f"subjectAltName={_SERVER_NAMES},IP:{node_ip}\nextendedKeyUsage=serverAuth",
    )


def _sign(pki: Path, stem: str, subject: str, extensions: str) -> None:
    """`stem`.key and `stem`.crt, signed by the CA for 10 years with `extensions` (openssl's x509v3 syntax)."""
    (pki / f"{stem}.ext").write_text(
        f"{extensions}\nkeyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n"
        "authorityKeyIdentifier=keyid\n"
    )
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject,
        cwd=pki,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", f"{stem}.crt", "-days", "3650", "-extfile", f"{stem}.ext", cwd=pki,
    )  # fmt: skip


def _write_tokens(path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        for user, (groups, stem) in USERS.items():
            row = [secrets.token_hex(24), user, stem]
            writer.writerow([*row, groups] if groups else row)
    path.chmod(0o600)


def ensure_pki(layout: ClusterLayout) -> None:
    """Create whatever of the CA, serving cert, service-account keys and token file is missing."""
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (pki / "apiserver.crt").exists():
        _make_ca_and_server_cert(pki, layout.node_ip)
    if not (pki / "sa.pub").exists():
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    if not (pki / "tokens.csv").exists():
        _write_tokens(pki / "tokens.csv")
    if not (pki / "kubelet-client.crt").exists():  # the apiserver's identity to a real kubelet (exec, logs)
        _sign(
            pki, "kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", "extendedKeyUsage=clientAuth"
        )


def read_token(layout: ClusterLayout, user: str) -> str:
    with (layout.pki / "tokens.csv").open(newline="") as f:
        for row in csv.reader(f):
            if row[1] == user:
                return row[0]
    raise KeyError(f"no token for {user!r} in {layout.pki / 'tokens.csv'}")


def write_kubeconfigs(layout: ClusterLayout) -> None:
    """One kubeconfig per user (JSON, which is YAML too), pointing at the CA by absolute path."""
    for user, (_, stem) in USERS.items():
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "agent-sandbox-dev", "cluster": {
                "server": layout.server, "certificate-authority": str(layout.pki / "ca.crt")}}],
            "users": [{"name": user, "user": {"token": read_token(layout, user)}}],
            "contexts": [{"name": "agent-sandbox-dev", "context": {"cluster": "agent-sandbox-dev", "user": user}}],
            "current-context": "agent-sandbox-dev",
        }  # fmt: skip
        path = layout.kubeconfig(stem)
        path.write_bytes(msgspec.json.format(msgspec.json.encode(config)) + b"\n")
        path.chmod(0o600)
