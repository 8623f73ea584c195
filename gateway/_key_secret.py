"""The bootstrap API key on Kubernetes: kept in a Secret that `install.yaml` creates empty.

No manifest can generate a random value, so the first replica to start fills the Secret's `api-key` with a new
key; the others (and every later start) read it. Two replicas filling it at once are settled by the Secret's
resourceVersion: the loser of the conflict reads the winner's key. The key is never logged.
"""

from __future__ import annotations

import base64
import logging
import secrets

import msgspec

from pool import KubeApi, KubeApiError

__all__ = ["api_key_from_secret"]

_log = logging.getLogger("agent-sandbox")
_FIELD = "api-key"


class _Meta(msgspec.Struct, kw_only=True, rename="camel"):
    resource_version: str = ""


class _Secret(msgspec.Struct, kw_only=True):
    metadata: _Meta
    data: dict[str, str] | None = None


_secret = msgspec.json.Decoder(_Secret)


async def api_key_from_secret(api: KubeApi, namespace: str, name: str) -> str:
    """The key in Secret `name`'s `api-key`, after putting a new one there if it has none."""
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    for _ in range(5):
        secret = _secret.decode(await api.call("GET", path))
        stored = (secret.data or {}).get(_FIELD)
        if stored:
            return base64.b64decode(stored).decode().strip()
        key = "e2b_" + secrets.token_hex(16)
        patch = {
            "metadata": {"resourceVersion": secret.metadata.resource_version},
            "data": {_FIELD: base64.b64encode(key.encode()).decode()},
        }
        try:
            await api.call("PATCH", path, body=patch, content_type="application/merge-patch+json")
        except KubeApiError as exc:
            if exc.status == 409:  # another replica filled it first: read theirs
                continue
            raise
        _log.info(
            "created the API key and stored it in Secret %s/%s (kubectl get secret -n %s %s "
            "-o jsonpath='{.data.api-key}' | base64 -d)", namespace, name, namespace, name,
        )  # fmt: skip
        return key
    raise RuntimeError(f"Secret {namespace}/{name} kept changing while its API key was being filled in")
