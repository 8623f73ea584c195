"""`X-API-Key` authentication: the key's id becomes `request.user`, the owner every handler acts for."""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from activator._e2b._state import api_keys_from

__all__ = ["ApiKeyAuth"]


class ApiKeyAuth(AbstractAuthenticationMiddleware):
    """Refuses requests without a valid `X-API-Key` (header names are case-insensitive) with 401, and every
    request from an address that failed too many key checks lately with 429 (`ApiKeys.check`)."""

    async def authenticate_request(self, connection: ASGIConnection[Any, Any, Any, Any]) -> AuthenticationResult:
        raw = connection.headers.get("x-api-key")
        if not raw:
            raise NotAuthorizedException("missing X-API-Key header")
        client = connection.client.host if connection.client else None  # TooManySignIns (429) past its limit
        owner = await api_keys_from(connection.app.state).check(raw, client)
        if owner is None:
            raise NotAuthorizedException("invalid API key")
        return AuthenticationResult(user=owner, auth=None)
