"""The gateway's side of the egress guard: the namespace's guard key, and putting rules in force in one pod.

The key is made by the first replica that needs it and kept in Secret `_shapes.GUARD_KEY_SECRET` (created here, so
install.yaml carries no key of its own); every replica reads the same one. Sandbox pods name it with a
secretKeyRef, so the Secret must exist before the first guarded pod starts: `GuardKey.get` runs before the
runtime creates anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._guard_wire import (
    GuardRefused,
    answer_mac,
    encode_rules,
    is_nonce,
    macs_match,
    new_key,
    new_nonce,
    request_mac,
)
from pool._kube._shapes import GUARD_KEY_FIELD, GUARD_KEY_ROLE, GUARD_KEY_SECRET, ROLE_LABEL, Secret, SecretMeta
from pool._runtime import EgressRules

__all__ = ["GuardKey", "put_rules"]

_ANSWER_BYTES = 4096


_secret = msgspec.json.Decoder(Secret)


class GuardKey:
    """The namespace's guard key, read (or made) once per process."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self._api = api
        self._secrets = f"/api/v1/namespaces/{namespace}/secrets"
        self._key: str | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> str:
        async with self._lock:
            if self._key is None:
                self._key = await self._read() or await self._create()
            return self._key

    async def _read(self) -> str | None:
        try:
            found = _secret.decode(await self._api.call("GET", f"{self._secrets}/{GUARD_KEY_SECRET}"))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        stored = found.data.get(GUARD_KEY_FIELD)
        if not stored:
            raise RuntimeFailure(
                f"Secret {GUARD_KEY_SECRET} has no `{GUARD_KEY_FIELD}`: delete it, and the gateway makes a new one"
            )
        return stored.decode()

    async def _create(self) -> str:
        key = new_key()
        meta = SecretMeta(name=GUARD_KEY_SECRET, labels={ROLE_LABEL: GUARD_KEY_ROLE})
        try:
            await self._api.call(
                "POST", self._secrets, body=Secret(metadata=meta, data={GUARD_KEY_FIELD: key.encode()})
            )
        except KubeApiError as exc:
            if exc.status != 409:
                raise
            theirs = await self._read()  # another replica made it first
            if theirs is None:
                raise RuntimeFailure(f"Secret {GUARD_KEY_SECRET} was made and deleted again meanwhile") from exc
            return theirs
        return key


async def put_rules(sock: socket.socket, key: str, pod: str, rules: EgressRules, *, within: float) -> None:
    """Have the guard of pod `pod`, at the other end of `sock`, enforce `rules` (`_guard_wire`'s exchange);
    `GuardRefused` unless it answered for them with the key. The socket is used up."""
    try:
        reader, writer = await asyncio.open_connection(sock=sock, limit=_ANSWER_BYTES)
    except BaseException:
        sock.close()
        raise
    try:
        async with asyncio.timeout(within):
            theirs = (await reader.readuntil(b"\n")).rstrip(b"\n")
            if not is_nonce(theirs):
                raise GuardRefused("the egress guard's port answered with no nonce")
            ours, body = new_nonce(), encode_rules(rules)
            writer.write(b" ".join((ours, request_mac(key, theirs, ours, pod, body), body)) + b"\n")
            answer = (await reader.readline()).rstrip(b"\n")
    except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise GuardRefused(f"no answer from the egress guard: {exc!r}") from exc
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    verdict, _, proof = answer.partition(b" ")
    if verdict == b"ok" and macs_match(answer_mac(key, theirs, ours, pod, body), proof):
        return
    if verdict == b"ok":
        raise GuardRefused("an answer of `ok` that is not the egress guard's (whoever holds its port)")
    raise GuardRefused(f"the egress guard refused the rules: {answer.decode(errors='replace') or 'closed'}")
