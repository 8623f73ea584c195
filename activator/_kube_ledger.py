"""Claimed Idempotency-Keys on Kubernetes (`_idempotency.KeyLedger`): one Secret per (API key, Idempotency-Key).

    idempotency-<sha256 of owner and key, 40 hex>   role=idempotency-key, data `claim`: the `ClaimedKey` JSON

Creating a Secret is atomic on the apiserver, so a claim is a create: of two replicas claiming one key at once,
one gets 201 and the other 409 AlreadyExists, reads the claim that stands and answers from it. A claim older than
the TTL is deleted under its resourceVersion and the create tried again. Expired claims of other keys are deleted
by a sweep at most every `SWEEP_INTERVAL` seconds per replica (a list of these Secrets and a delete each).

Also what `_kube_store` shares with it: reading and deleting a Secret, and the one translation of the apiserver's
failures into the activator's error.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator

import msgspec

from activator._errors import ActivatorError
from activator._idempotency import ClaimedKey
from pool import KubeApi, KubeApiError, RuntimeFailure
from pool import kube_shapes as shapes

__all__ = ["SWEEP_INTERVAL", "KubeKeyLedger", "delete_secret", "read_secret", "store_errors"]

SWEEP_INTERVAL = 3600.0  # seconds between two sweeps of expired claims (per replica)
_ATTEMPTS = 10  # replaced expired claims in a row before a claim gives up

_encode = msgspec.json.Encoder().encode
_decode_claim = msgspec.json.Decoder(ClaimedKey).decode
_decode_secret = msgspec.json.Decoder(shapes.Secret).decode
_decode_list = msgspec.json.Decoder(shapes.SecretList).decode


class KubeKeyLedger:
    """Idempotency-Key claims as Secrets in one namespace; see the module docstring."""

    def __init__(self, api: KubeApi, namespace: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._path = f"/api/v1/namespaces/{namespace}/secrets"
        self._clock = clock
        self._swept_at = -SWEEP_INTERVAL  # `clock` time of the last sweep

    async def claim_key(self, claim: ClaimedKey, *, expired_before: float) -> ClaimedKey | None:
        """As `KeyLedger.claim_key`: a create, or the claim that stands (an expired one is replaced)."""
        name = _name(claim.owner, claim.key)
        with store_errors(f"claim Idempotency-Key {claim.key!r}"):
            await self._sweep(expired_before)
            for _ in range(_ATTEMPTS):
                try:
                    await self._api.call("POST", self._path, body=_secret(name, claim))
                    return None
                except KubeApiError as exc:
                    if exc.status != 409:
                        raise
                found = await read_secret(self._api, self._path, name)
                if found is None:
                    continue  # deleted meanwhile: claim again
                standing = _claim_of(found)
                if standing.at >= expired_before:
                    return standing
                await delete_secret(self._api, self._path, found)
        raise ActivatorError(f"the state store could not claim Idempotency-Key {claim.key!r}: it kept changing")

    async def settle_key(self, claim: ClaimedKey) -> None:
        """Replace the claim's Secret by one with the answer (only its claimant writes it)."""
        name = _name(claim.owner, claim.key)
        with store_errors(f"store the answer of Idempotency-Key {claim.key!r}"):
            await self._api.call("PUT", f"{self._path}/{name}", body=_secret(name, claim))

    async def release_key(self, owner: str, key: str) -> None:
        """Delete the claim's Secret (gone already: nothing to do)."""
        with store_errors(f"release Idempotency-Key {key!r}"):
            try:
                await self._api.call("DELETE", f"{self._path}/{_name(owner, key)}")
            except KubeApiError as exc:
                if exc.status != 404:
                    raise

    async def _sweep(self, expired_before: float) -> None:
        if self._clock() - self._swept_at < SWEEP_INTERVAL:
            return
        self._swept_at = self._clock()
        params = {"labelSelector": shapes.IDEMPOTENCY_SELECTOR}
        listed = _decode_list(await self._api.call("GET", self._path, params=params))
        for secret in listed.items:
            if _claim_of(secret).at < expired_before:
                await delete_secret(self._api, self._path, secret)


async def read_secret(api: KubeApi, path: str, name: str) -> shapes.Secret | None:
    """The Secret named `name` under `path` (a namespace's secrets), or None if there is none."""
    try:
        return _decode_secret(await api.call("GET", f"{path}/{name}"))
    except KubeApiError as exc:
        if exc.status == 404:
            return None
        raise


async def delete_secret(api: KubeApi, path: str, secret: shapes.Secret) -> bool:
    """Delete the Secret if it is still the version read; False if another writer changed or deleted it."""
    preconditions = {"resourceVersion": secret.metadata.resource_version}
    options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions}
    try:
        await api.call("DELETE", f"{path}/{secret.metadata.name}", body=options)
    except KubeApiError as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


def _name(owner: str, key: str) -> str:
    return shapes.idempotency_secret_name(hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()[:40])


def _secret(name: str, claim: ClaimedKey) -> shapes.Secret:
    meta = shapes.SecretMeta(name=name, labels={shapes.ROLE_LABEL: shapes.IDEMPOTENCY_ROLE})
    return shapes.Secret(metadata=meta, type=shapes.IDEMPOTENCY_TYPE, data={shapes.CLAIM_DATA: _encode(claim)})


def _claim_of(secret: shapes.Secret) -> ClaimedKey:
    blob = secret.data.get(shapes.CLAIM_DATA)
    if blob is None:
        raise ActivatorError(f"the state store's Secret {secret.metadata.name} holds no claim")
    return _decode_claim(blob)


@contextlib.contextmanager
def store_errors(what: str) -> Iterator[None]:
    """The apiserver's failures and unreadable objects as the activator's own error (500)."""
    try:
        yield
    except RuntimeFailure as exc:
        raise ActivatorError(f"the state store could not {what}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ActivatorError(f"the state store could not {what}: an unreadable object: {exc}") from exc
