"""Errors of the lifecycle layer, each with the HTTP status the control plane answers with.

ActivatorError                 500  base class
├── SandboxNotFound            404  no such sandbox for this owner (502 on the data plane)
├── PortNotOpen                502  the sandbox runs but nothing listens on the port
├── InvalidRequest             400  the request is malformed
├── TemplateNotFound           404  the request names no template we have (in `_catalog`)
├── SandboxConflict            409  the transition is not allowed in the current state
├── IdempotencyConflict        409  the Idempotency-Key's create runs still, or its outcome is unknown
├── IdempotencyMismatch        422  the Idempotency-Key was used with another request
├── QuotaExceeded              429  the API key's sandboxes hold its limit already (`_quota`; E2B's full team)
├── TooManySignIns             429  this client address failed too many key checks (`_signin`; Retry-After)
├── TooManyRequests            429  this key sent more requests than its pace allows (`_pacing`; Retry-After)
├── GuestUnresponsive          503  `requireHealthyGuest`: the sandbox's executor does not answer
├── NotSupported               501  an E2B feature this server does not offer (yet)
├── HoldQueueFull              503  too many requests are already held for sandboxes
├── HoldTimeout                504  the sandbox did not become ready before the hold deadline
└── ClientGone                 499  the client disconnected while its request was held (nobody reads the answer)

`error_code` is E2B's machine-readable code (the SDK's `Error.error_code`), sent when it is set.
"""

from __future__ import annotations

__all__ = [
    "ActivatorError",
    "ClientGone",
    "GuestUnresponsive",
    "HoldQueueFull",
    "HoldTimeout",
    "IdempotencyConflict",
    "IdempotencyMismatch",
    "InvalidRequest",
    "NotSupported",
    "PortNotOpen",
    "QuotaExceeded",
    "SandboxConflict",
    "SandboxNotFound",
    "TooManySignIns",
    "VolumeRefused",
]


class ActivatorError(Exception):
    """Base class: something in the sandbox lifecycle failed."""

    status_code = 500
    error_code: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SandboxNotFound(ActivatorError):
    """The sandbox does not exist, or belongs to another API key."""

    status_code = 404


class PortNotOpen(ActivatorError):
    """The sandbox is running but nothing accepts connections on the port."""

    status_code = 502


class InvalidRequest(ActivatorError):
    """The request cannot be carried out as given."""

    status_code = 400


class SandboxConflict(ActivatorError):
    """The sandbox is in a state that does not allow the transition."""

    status_code = 409


class IdempotencyConflict(ActivatorError):
    """The create of this Idempotency-Key still runs (`idempotency_in_progress`) or was cut short by a restart
    (`idempotency_outcome_unknown`)."""

    status_code = 409

    def __init__(self, message: str, error_code: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class IdempotencyMismatch(ActivatorError):
    """The Idempotency-Key was used before with another request body."""

    status_code = 422
    error_code = "idempotency_request_mismatch"


class QuotaExceeded(ActivatorError):
    """A create would take the API key's live sandboxes past one of its limits; nothing was started."""

    status_code = 429


class TooManySignIns(ActivatorError):
    """The client's address failed too many key checks lately; `retry_after` seconds until it may try again."""

    status_code = 429

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooManyRequests(ActivatorError):
    """The key sent more requests than its pace allows, by more than the wait a request may take (`_pacing`)."""

    status_code = 429

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class GuestUnresponsive(ActivatorError):
    """`requireHealthyGuest`: the sandbox's executor did not answer, so it was not paused (E2B: retry later)."""

    status_code = 503


class NotSupported(ActivatorError):
    """The request uses an E2B feature this server does not offer; the message names it."""

    status_code = 501


class HoldQueueFull(ActivatorError):
    """The cap on held requests is reached; the client should retry later."""

    status_code = 503


class HoldTimeout(ActivatorError):
    """The sandbox did not become ready within the hold deadline."""

    status_code = 504


class ClientGone(ActivatorError):
    """The client disconnected while its request was held; the request is dropped, never proxied."""

    status_code = 499  # nginx's "client closed request": only logs and metrics ever see it


class VolumeRefused(ActivatorError):
    """A volume call the volume store refused, with the status it chose (400, 404, 409, 507)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status
