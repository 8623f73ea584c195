"""The access-token check, and the URL signatures `/files` accepts instead (e2b-protocol.md §3.1).

Once a token is set (through /init or --init-file) every request must carry it in `X-Access-Token`,
except `/health` and `/files`, which check it themselves so that they can take a URL signature
instead. `/init` is not exempt: after the first token is set, changing it takes the current one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from executor._defaults import Defaults
from executor._errors import Unauthenticated
from executor.envd import ACCESS_TOKEN_HEADER

__all__ = ("UNAUTHORIZED_MESSAGE", "check_file_access", "request_allowed", "sign")

UNAUTHORIZED_MESSAGE = "unauthorized access, please provide a valid access token or method signing if supported"
_TOKEN = ACCESS_TOKEN_HEADER.lower()  # request headers arrive with lower-case names
_EXEMPT = frozenset(
    {("GET", "/health"), ("HEAD", "/health"), ("GET", "/files"), ("HEAD", "/files"), ("POST", "/files")}
)


def request_allowed(defaults: Defaults, method: str, path: str, headers: Mapping[str, str]) -> bool:
    """Whether the request may proceed past the general token check."""
    if defaults.access_token is None or (method, path) in _EXEMPT:
        return True
    return _same(headers.get(_TOKEN, ""), defaults.access_token)


def check_file_access(defaults: Defaults, headers: Mapping[str, str], query: Mapping[str, str], operation: str) -> None:
    """Raise Unauthenticated unless `/files` got the token, or a valid signature for `operation`."""
    token = defaults.access_token
    if token is None:
        return
    header = headers.get(_TOKEN, "")
    if header:
        if not _same(header, token):
            raise Unauthenticated("access token present in header but does not match")
        return
    signature = query.get("signature")
    if signature is None:
        raise Unauthenticated("missing signature query parameter")
    expiration = query.get("signature_expiration")
    if expiration is not None and not expiration.lstrip("-").isdigit():
        raise Unauthenticated("invalid signature expiration")
    expected = sign(query.get("path", ""), operation, query.get("username", ""), token, expiration)
    if not _same(signature, expected):
        raise Unauthenticated("invalid signature")
    if expiration is not None and int(expiration) < time.time():
        raise Unauthenticated("signature is already expired")


def sign(path: str, operation: str, username: str, token: str, expiration: str | None) -> str:
    """`v1_` + unpadded base64 of SHA-256("path:operation:username:token[:expiration]")."""
    import base64
    import hashlib

    parts = [path, operation, username, token] + ([expiration] if expiration is not None else [])
    digest = hashlib.sha256(":".join(parts).encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")


def _same(given: str, expected: str) -> bool:
    import hmac

    return hmac.compare_digest(given.encode(), expected.encode())
