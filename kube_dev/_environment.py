"""A container's environment, resolved the way a kubelet does it: env vars, fieldRefs, ConfigMaps, Secrets.

Order (later wins, as in Kubernetes): the base variables, then `envFrom` sources, then `env` entries; each
`env` value may refer to earlier ones with `$(NAME)`.
"""

from __future__ import annotations

import base64
import re

import msgspec

from kube_dev._convention import expand
from kube_dev._objects import Container, EnvVarSource, KeySelector, Pod
from pool import KubeApi, KubeApiError

__all__ = ["container_env"]

_BASE = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
_META_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class _Sources:
    """ConfigMap and Secret data fetched once per container start (None: the object does not exist)."""

    def __init__(self, client: KubeApi, namespace: str) -> None:
        self._client = client
        self._namespace = namespace
        self._cache: dict[tuple[str, str], dict[str, str] | None] = {}

    async def data(self, kind: str, name: str) -> dict[str, str] | None:
        if (kind, name) not in self._cache:
            self._cache[kind, name] = await self._fetch(kind, name)
        return self._cache[kind, name]

    async def _fetch(self, kind: str, name: str) -> dict[str, str] | None:
        try:
            raw = await self._client.call("GET", f"/api/v1/namespaces/{self._namespace}/{kind}/{name}")
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        data: dict[str, str] = msgspec.json.decode(raw).get("data") or {}
        if kind == "secrets":
            return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        return data


def _field(pod: Pod, pod_ip: str, path: str) -> str:
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.podIP": pod_ip,
        "status.hostIP": "127.0.0.1",
    }
    if path in simple:
        return simple[path]
    match = _META_KEY.match(path)
    if match:
        source = pod.metadata.labels if match.group(1) == "labels" else pod.metadata.annotations
        return source.get(match.group(2), "")
    return ""


async def _key(sources: _Sources, kind: str, ref: KeySelector) -> str | None:
    data = await sources.data(kind, ref.name)
    value = None if data is None else data.get(ref.key)
    if value is None and not ref.optional:
        raise LookupError(f"{kind[:-1]} {ref.name!r} has no key {ref.key!r}")
    return value


async def _value_from(source: EnvVarSource, pod: Pod, pod_ip: str, sources: _Sources) -> str | None:
    if source.field_ref is not None:
        return _field(pod, pod_ip, source.field_ref.field_path)
    if source.config_map_key_ref is not None:
        return await _key(sources, "configmaps", source.config_map_key_ref)
    if source.secret_key_ref is not None:
        return await _key(sources, "secrets", source.secret_key_ref)
    return None


async def container_env(client: KubeApi, pod: Pod, container: Container, pod_ip: str) -> dict[str, str]:
    """The environment for `container`; raises LookupError when a required ConfigMap/Secret key is missing."""
    sources = _Sources(client, pod.metadata.namespace)
    env: dict[str, str] = {**_BASE, "HOSTNAME": pod.metadata.name}
    for env_from in container.env_from:
        ref, kind = (
            (env_from.config_map_ref, "configmaps") if env_from.config_map_ref else (env_from.secret_ref, "secrets")
        )
        if ref is None:
            continue
        data = await sources.data(kind, ref.name)
        if data is None and not ref.optional:
            raise LookupError(f"{kind[:-1]} {ref.name!r} not found")
        env.update({env_from.prefix + k: v for k, v in (data or {}).items()})
    for var in container.env:
        if var.value_from is None:
            env[var.name] = expand(var.value, env)
        else:
            value = await _value_from(var.value_from, pod, pod_ip, sources)
            if value is not None:
                env[var.name] = value
    return env
