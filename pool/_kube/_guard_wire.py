"""The egress guard's control protocol: how the gateway hands a sandbox pod's guard the rules to enforce.

The guard (`_guard`) listens on `GUARD_PORT` of the pod and answers only peers from outside it (the sandbox
reaches the port over loopback alone: its own table turns its pod address into the proxy's). Even so, whoever
holds the port while the guard is down could be anyone in the sandbox, so each side proves itself to the other
without showing anything it could use:

    guard → gateway   its nonce: `NONCE_HEX` hex digits, one line
    gateway → guard   its own nonce, a space, HMAC(key, "rules", both nonces, the pod's name, body) in hex, a
                      space, the body (JSON `EgressRules`), a newline
    guard → gateway   `ok` and HMAC(key, "ok", both nonces, the pod's name, body) in hex, or `error: <why>`

The key is the namespace's Secret `_shapes.GUARD_KEY_SECRET`, which reaches the guard's container only (an env
var of it, never the sandbox's). The guard's nonce makes a captured request worthless later; the gateway's makes
an `ok` that is not the guard's detectable; the pod's name (the guard's own, from the downward API) keeps a
request meant for a pod whose address another pod has taken since from applying there.
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
    "GUARD_POD_ENV",
    "GUARD_PORT",
    "MAX_REQUEST_BYTES",
    "GuardRefused",
    "answer_mac",
    "decode_rules",
    "encode_rules",
    "is_nonce",
    "macs_match",
    "new_key",
    "new_nonce",
    "request_mac",
]

GUARD_CONTAINER = "egress-guard"
GUARD_PORT = 49982  # beside the executor's 49983; taken in every guarded pod, so no template may use it
# The guard's own packets carry this mark, which its table lets out (nothing else in a pod's namespace marks).
# Clear of the kubelet's 0x4000 and 0x8000 bits, in case a node ever keeps marks across namespaces.
GUARD_MARK = 0x1D0A
GUARD_KEY_ENV = "AGENT_SANDBOX_GUARD_KEY"
GUARD_POD_ENV = "AGENT_SANDBOX_POD_NAME"  # the guard's pod's name (downward API), which requests must name
MAX_REQUEST_BYTES = 64 * 1024  # a request line: signature and rules (E2B's rules are a few hundred entries at most)
_NONCE_BYTES = 16
NONCE_HEX = 2 * _NONCE_BYTES

_encoder = msgspec.json.Encoder()
_rules = msgspec.json.Decoder(EgressRules)


class GuardRefused(Exception):
    """The guard did not put the rules in force; the message is its answer or why there was none."""


def new_key() -> str:
    return secrets.token_hex(32)


def new_nonce() -> bytes:
    return secrets.token_hex(_NONCE_BYTES).encode()


def is_nonce(value: bytes) -> bool:
    return len(value) == NONCE_HEX and all(c in b"0123456789abcdef" for c in value)


def request_mac(key: str, guard_nonce: bytes, caller_nonce: bytes, pod: str, body: bytes) -> bytes:
    return _mac(key, b"rules", guard_nonce, caller_nonce, pod, body)


def answer_mac(key: str, guard_nonce: bytes, caller_nonce: bytes, pod: str, body: bytes) -> bytes:
    return _mac(key, b"ok", guard_nonce, caller_nonce, pod, body)


def macs_match(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


def _mac(key: str, kind: bytes, guard_nonce: bytes, caller_nonce: bytes, pod: str, body: bytes) -> bytes:
    message = b"\n".join((kind, guard_nonce, caller_nonce, pod.encode(), body))  # nonces and names hold no newline
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest().encode()


def encode_rules(rules: EgressRules) -> bytes:
    return _encoder.encode(rules)


def decode_rules(body: bytes) -> EgressRules:
    """`ValueError` for a body that is not `EgressRules` (msgspec's message says where)."""
    try:
        return _rules.decode(body)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from exc
