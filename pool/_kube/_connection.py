"""Where the Kubernetes API is and how to authenticate to it: a kubeconfig file, or the in-cluster convention.

Supported kubeconfig credentials: a bearer `token` or `tokenFile`, and client certificates (files or inline
`-data`); the CA as a file or inline, or `insecure-skip-tls-verify`. Exec and auth-provider plugins are not
supported (a clear error says so). In a pod, the ServiceAccount's token is read again whenever its file
changes, since bound tokens rotate.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import httpx
import msgspec
import yaml  # type: ignore[import-untyped]  # PyYAML ships no annotations; only safe_load is used

from pool._errors import RuntimeFailure

__all__ = ["SERVICE_ACCOUNT_DIR", "Connection", "in_cluster", "load_kubeconfig"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Connection(msgspec.Struct, frozen=True, kw_only=True):
    """An apiserver address with what authenticates to it; `namespace` is the config's own default."""

    server: str
    verify: ssl.SSLContext
    token: str | None = None
    token_file: Path | None = None
    namespace: str | None = None


class TokenFileAuth(httpx.Auth):
    """A bearer token read from a file, read again whenever the file changes (rotated ServiceAccount tokens)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._mtime = -1.0
        self._token = ""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        mtime = self._path.stat().st_mtime
        if mtime != self._mtime:
            self._token, self._mtime = self._path.read_text().strip(), mtime
        request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


def in_cluster(environ: Mapping[str, str], directory: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    """The pod's own ServiceAccount, as every in-cluster client finds it."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (directory / "token").exists():
        raise RuntimeFailure("not running in a Kubernetes pod (no KUBERNETES_SERVICE_HOST or ServiceAccount token)")
    namespace_file = directory / "namespace"
    return Connection(
        server=f"https://{_host(host)}:{port}",
        verify=ssl.create_default_context(cafile=directory / "ca.crt"),
        token_file=directory / "token",
        namespace=namespace_file.read_text().strip() if namespace_file.exists() else None,
    )


def load_kubeconfig(path: Path, context: str | None = None) -> Connection:
    """The connection of `context` (default: the file's current context) in the kubeconfig at `path`."""
    try:
        config = yaml.safe_load(path.read_text())
        return _from_config(config, path.parent, context)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, ssl.SSLError) as exc:
        raise RuntimeFailure(f"cannot use kubeconfig {path}: {exc!r}") from exc


def _from_config(config: dict[str, Any], base: Path, context_name: str | None) -> Connection:
    name = context_name or config["current-context"]
    context = _named(config, "contexts", name)["context"]
    cluster = _named(config, "clusters", context["cluster"])["cluster"]
    user = _named(config, "users", context["user"])["user"] if context.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise ValueError(f"user {context['user']!r} uses an exec or auth-provider plugin, which is not supported")
    verify = _tls_context(cluster, base)
    cert = _material(user, "client-certificate", base)
    if cert is not None:
        key = _material(user, "client-key", base)
        with _PemFiles(cert, key or b"") as (cert_file, key_file):
            verify.load_cert_chain(cert_file, key_file if key else None)
    token_file = user.get("tokenFile")
    return Connection(
        server=str(cluster["server"]).rstrip("/"),
        verify=verify,
        token=user.get("token"),
        token_file=base / token_file if token_file else None,
        namespace=context.get("namespace"),
    )


def _named(config: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return dict(entry)
    raise KeyError(f"no {section[:-1]} named {name!r}")


def _tls_context(cluster: dict[str, Any], base: Path) -> ssl.SSLContext:
    if cluster.get("insecure-skip-tls-verify"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    ca = _material(cluster, "certificate-authority", base)
    return ssl.create_default_context(cadata=ca.decode() if ca else None)


def _material(section: dict[str, Any], key: str, base: Path) -> bytes | None:
    """PEM bytes from `<key>-data` (base64) or the file named by `<key>` (relative to the kubeconfig)."""
    if data := section.get(f"{key}-data"):
        return base64.b64decode(data)
    if file := section.get(key):
        return (base / str(file)).read_bytes()
    return None


class _PemFiles:
    """Two temporary private files holding PEM data, for `load_cert_chain` (which reads only files)."""

    def __init__(self, *contents: bytes) -> None:
        self._contents = contents
        self._dir = tempfile.TemporaryDirectory(prefix="agent-sandbox-kube-")

    def __enter__(self) -> tuple[str, str]:
        paths = []
        for n, content in enumerate(self._contents):
            path = os.path.join(self._dir.name, f"{n}.pem")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
                file.write(content)
            paths.append(path)
        return paths[0], paths[1]

    def __exit__(self, *exc: object) -> None:
        self._dir.cleanup()


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
