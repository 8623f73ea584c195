"""`POST /init` and `--init-file`: how the control plane configures a (possibly warm) sandbox.

The body is envd's init message; the fields used are `envVars` (merged into the environment of
every process started afterwards), `accessToken` (replaces the token; "" removes it),
`defaultUser` and `defaultWorkdir`. Others (`timestamp`, `volumeMounts`, …) are accepted and
ignored. Who may call it is `_auth`'s concern: anyone until a token is set, then only its holder.
"""

from __future__ import annotations

import msgspec

from executor._defaults import Defaults
from executor._envelopes import decode
from executor._errors import InvalidArgument, Unauthenticated
from executor._users import lookup
from executor.envd import InitRequest

__all__ = ("apply_init",)

_decoder = msgspec.json.Decoder(InitRequest)


def apply_init(defaults: Defaults, body: bytes) -> None:
    """Validate the whole message first, then apply it: a bad message changes nothing."""
    request = decode(_decoder, body or b"{}", "init")
    if request.default_user is not None:
        try:
            lookup(request.default_user)
        except Unauthenticated as exc:
            raise InvalidArgument(f"unknown default user '{request.default_user}'") from exc
    if request.env_vars is not None:
        defaults.env_vars.update(request.env_vars)
    if request.access_token is not None:
        defaults.access_token = request.access_token or None
    if request.default_user is not None:
        defaults.user = request.default_user
    if request.default_workdir is not None:
        defaults.workdir = request.default_workdir or None
