"""API keys: `e2b_<32 hex>`, stored only as SHA-256 digests; a key's id is the owner of its sandboxes.

Verification asks the store on every request: each store answers from memory and bounds how long a key revoked
elsewhere (another process, another replica) keeps working, which a cache here could not know about.

A revoked key is kept, marked with the time it was revoked: it verifies no more at once (UI sessions and MCP
requests included: both check the key on every request), and the reaper kills its sandboxes once the server's
grace period has passed since then (`Reaper`, `serve --revoked-key-grace`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
import uuid
from collections.abc import Callable

import msgspec

from activator._pacing import RequestPacer
from activator._records import ApiKey, KeyLimits
from activator._signin import SignInLimiter
from activator._store import Store

__all__ = ["KEY_PATTERN", "ApiKeys"]

KEY_PATTERN = re.compile(r"e2b_[0-9a-f]{32}")  # the E2B JS SDK and CLI refuse keys not shaped `e2b_<hex>`
_SERVER_LIMITS = KeyLimits()  # every limit left to the server's defaults


class ApiKeys:
    """Creates, lists, revokes and verifies API keys."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        signin: SignInLimiter | None = None,
        pacer: RequestPacer | None = None,
    ) -> None:
        """`signin` limits the failed checks of each client address (`check`), `pacer` the requests of each key
        that passes it; None: no limit."""
        self._store = store
        self._clock = clock
        self._signin = signin or SignInLimiter(0)
        self._pacer = pacer or RequestPacer(0)

    async def create(self, name: str, limits: KeyLimits = _SERVER_LIMITS) -> tuple[ApiKey, str]:
        """A new random key: its listing and the key itself, which is shown once and never stored."""
        raw = "e2b_" + secrets.token_hex(16)
        return await self._register(raw, name, limits), raw

    async def list_keys(self) -> list[ApiKey]:
        """Every key, revoked ones included, oldest first."""
        return await self._store.keys()

    async def get(self, key_id: str) -> ApiKey | None:
        """The key with this id, revoked or not; None if there is none."""
        return await self._store.key(key_id)

    async def active(self, key_id: str) -> bool:
        """Whether the key with this id exists and is not revoked (read from the store, as `verify` is)."""
        key = await self._store.key(key_id)
        return key is not None and key.revoked_at is None

    async def update(self, key_id: str, limits: KeyLimits) -> ApiKey | None:
        """Replace the limits of a key; the key as updated, None if there is none with this id. The key's next
        create is admitted by them (`_quota` reads them at every create)."""
        key = await self._store.key(key_id)
        if key is None:
            return None
        changed = msgspec.structs.replace(key, limits=limits)
        return changed if await self._store.update_key(changed) else None

    async def revoke(self, key_id: str) -> bool:
        """Revoke a key: it stops verifying at once; False if there is no unrevoked key with this id."""
        key = await self._store.key(key_id)
        if key is None or key.revoked_at is not None:
            return False
        return await self._store.update_key(msgspec.structs.replace(key, revoked_at=self._clock()))

    async def verify(self, raw: str) -> str | None:
        """The id of the key `raw`, or None if it is not a key of ours."""
        if not KEY_PATTERN.fullmatch(raw):
            return None
        return await self._store.key_id(_digest(raw))

    async def check(self, raw: str, client: str | None) -> str | None:
        """`verify` for a request from the address `client`, within its sign-in limit (`_signin`): TooManySignIns
        (429) while the address failed too often lately, whatever `raw` is; `client` None is an address we do
        not know (no sign-in limit). A right key then waits for its turn, whatever the address (`_pacing`)."""
        if client is not None:
            self._signin.attempt(client)
        owner = await self.verify(raw)
        if owner is not None:
            if client is not None:
                self._signin.succeeded(client)
            await self._pacer.admit(owner)  # TooManyRequests (429) when its turn is too far off
        return owner

    async def ensure_bootstrap_key(self, explicit: str | None) -> str | None:
        """Make sure some key works: register `explicit` (AGENT_SANDBOX_API_KEY), or create one when none works (on
        first start, or once every key was revoked). A revoked `explicit` stays revoked.

        Returns the key only when it was created here, for the caller to print once and write to
        `<data-dir>/api-key`. Raises ValueError if `explicit` is not shaped like a key. Registering `explicit` is
        idempotent even when replicas start at once: the store keeps one entry per digest.
        """
        if explicit is not None:
            if not KEY_PATTERN.fullmatch(explicit):
                raise ValueError("AGENT_SANDBOX_API_KEY must be 'e2b_' followed by 32 lowercase hex digits")
            if await self.verify(explicit) is None:
                await self._register(explicit, "AGENT_SANDBOX_API_KEY")
            return None
        if any(key.revoked_at is None for key in await self._store.keys()):
            return None
        return (await self.create("bootstrap"))[1]

    async def _register(self, raw: str, name: str, limits: KeyLimits = _SERVER_LIMITS) -> ApiKey:
        key = ApiKey(id=uuid.uuid4().hex, name=name, created_at=self._clock(), limits=limits)
        await self._store.add_key(key, _digest(raw))
        return key


def _digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()
