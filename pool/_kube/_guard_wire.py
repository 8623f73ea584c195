"""The egress guard's control protocol: how the gateway hands a sandbox pod's guard the rules to enforce.

The guard (`_guard`) listens on `GUARD_PORT` of the pod, where the sandbox's own processes can reach it too,
so a request must prove it comes from the gateway without ever showing the sandbox something it could use:

    guard → gateway   a fresh random nonce, one line of hex
    gateway → guard   HMAC-SHA256(key, nonce ‖ body) in hex, a space, the body (JSON `EgressRules`), a newline
    guard → gateway   `ok` or `error: <why>`, one line

The key is the namespace's Secret `_shapes.GUARD_KEY_SECRET`, which reaches the guard's container only (an env var of
it, never the sandbox's). The nonce is the guard's and good for one request, so a request captured by whoever
held the port while the guard was down (root in the sandbox may bind it then) cannot be replayed later.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import msgspec

from pool._runtime import EgressRules

__all__ = [
    "GUARD_CONTAINER",
    "GUARD_KEY_ENV",
    "GUARD_MARK",
    "GUARD_PORT",
    "MAX_REQUEST_BYTES",
    "GuardRefused",
    "decode_rules",
    "encode_rules",
    "new_key",
    "new_nonce",
    "sign",
    "signature_holds",
]

GUARD_CONTAINER = "egress-guard"
GUARD_PORT = 49982  # beside the executor's 49983; taken in every guarded pod, so no template may use it
# The guard's own packets carry this mark, which its table lets out (nothing else in a pod's namespace marks).
# Clear of the kubelet's 0x4000 and 0x8000 bits, in case a node ever keeps marks across namespaces.
GUARD_MARK = 0x1D0A
GUARD_KEY_ENV = "AGENT_SANDBOX_GUARD_KEY"
MAX_REQUEST_BYTES = 64 * 1024  # a request line: signature and rules (E2B's rules are a few hundred entries at most)
_NONCE_BYTES = 16

_encoder = msgspec.json.Encoder()
_rules = msgspec.json.Decoder(EgressRules)


class GuardRefused(Exception):
    """The guard did not put the rules in force; the message is its answer or why there was none."""


def new_key() -> str:
    return secrets.token_hex(32)


def new_nonce() -> bytes:
    return secrets.token_hex(_NONCE_BYTES).encode()


def sign(key: str, nonce: bytes, body: bytes) -> bytes:
    return hmac.new(key.encode(), nonce + body, hashlib.sha256).hexdigest().encode()


def signature_holds(key: str, nonce: bytes, body: bytes, signature: bytes) -> bool:
    return hmac.compare_digest(sign(key, nonce, body), signature)


def encode_rules(rules: EgressRules) -> bytes:
    return _encoder.encode(rules)


def decode_rules(body: bytes) -> EgressRules:
    """`ValueError` for a body that is not `EgressRules` (msgspec's message says where)."""
    try:
        return _rules.decode(body)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from exc
