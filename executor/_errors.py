"""Errors the executor raises on purpose, and how each one reaches a client.

    ExecutorError                 base: a message plus a Connect code and an HTTP status
     ├── InvalidArgument          400 invalid_argument     malformed request, bad path, wrong file type
     ├── Unauthenticated          401 unauthenticated      bad token, unknown user, bad URL signature
     ├── PermissionDenied         403 permission_denied    the kernel said EACCES / EPERM
     ├── NotFound                 404 not_found            no such file, process or watcher
     ├── AlreadyExists            409 already_exists       MakeDir on an existing directory
     ├── FailedPrecondition       400 failed_precondition  e.g. resizing a process that has no PTY
     ├── PayloadTooLarge          413 resource_exhausted   over the upload or message size limit
     ├── NotEnoughSpace           507 resource_exhausted   ENOSPC / EDQUOT
     ├── DeadlineExceeded         504 deadline_exceeded    Connect-Timeout-Ms expired
     ├── Unimplemented            501 unimplemented        unknown RPC, codec or compression
     └── Internal                 500 internal             anything else

Services raise these; two boundaries translate them: `_connect` into Connect errors (the code),
`_files` and `_app` into E2B's JSON `{"code": <status>, "message": ...}` (the status).
`os_errors()` turns the OSErrors of filesystem work into the matching class.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

__all__ = (
    "AlreadyExists",
    "DeadlineExceeded",
    "ExecutorError",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotEnoughSpace",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "Unauthenticated",
    "Unimplemented",
    "error_json",
    "os_errors",
)


class ExecutorError(Exception):
    """An error with a message meant for the client."""

    code = "unknown"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ExecutorError):
    """The request is malformed or names something of the wrong kind."""

    code, status = "invalid_argument", 400


class Unauthenticated(ExecutorError):
    """The access token, user name or URL signature was not accepted."""

    code, status = "unauthenticated", 401


class PermissionDenied(ExecutorError):
    """The kernel refused the operation."""

    code, status = "permission_denied", 403


class NotFound(ExecutorError):
    """The file, process or watcher does not exist."""

    code, status = "not_found", 404


class AlreadyExists(ExecutorError):
    """The thing to create is already there."""

    code, status = "already_exists", 409


class FailedPrecondition(ExecutorError):
    """The target exists but is not in a state that allows the operation."""

    code, status = "failed_precondition", 400


class PayloadTooLarge(ExecutorError):
    """A body or message is over its configured size limit."""

    code, status = "resource_exhausted", 413


class NotEnoughSpace(ExecutorError):
    """The filesystem ran out of space or inodes."""

    code, status = "resource_exhausted", 507


class DeadlineExceeded(ExecutorError):
    """The caller's Connect-Timeout-Ms expired before the RPC finished."""

    code, status = "deadline_exceeded", 504


class Unimplemented(ExecutorError):
    """The RPC, codec or compression is not supported by this server."""

    code, status = "unimplemented", 501


class Internal(ExecutorError):
    """Something failed that the client cannot fix."""

    code, status = "internal", 500


_BY_ERRNO: dict[int, type[ExecutorError]] = {
    errno.ENOENT: NotFound,
    errno.EEXIST: AlreadyExists,
    errno.ENOTDIR: InvalidArgument,
    errno.EISDIR: InvalidArgument,
    errno.ENOTEMPTY: FailedPrecondition,
    errno.EINVAL: InvalidArgument,
    errno.ENAMETOOLONG: InvalidArgument,
    errno.ENXIO: InvalidArgument,  # a socket or a device with no driver: /proc/self/fd/<socket>
    errno.ENODEV: InvalidArgument,
    errno.ELOOP: FailedPrecondition,
    errno.EXDEV: FailedPrecondition,
    errno.EACCES: PermissionDenied,
    errno.EPERM: PermissionDenied,
    errno.EROFS: PermissionDenied,
    errno.ENOSPC: NotEnoughSpace,
    errno.EDQUOT: NotEnoughSpace,
}


@contextlib.contextmanager
def os_errors(action: str) -> Iterator[None]:
    """Re-raise an OSError (or a NUL byte in a path) as the ExecutorError a client should see.

    `action` starts the message, e.g. "error creating directory '/x'".
    """
    try:
        yield
    except ValueError as exc:  # "embedded null byte" from any os.* call
        raise InvalidArgument(f"{action}: {exc}") from exc
    except OSError as exc:
        kind = _BY_ERRNO.get(exc.errno or 0, Internal)
        raise kind(f"{action}: {exc.strerror or exc}") from exc


def error_json(status: int, message: str) -> bytes:
    """E2B's error body for plain HTTP endpoints: `{"code": <status>, "message": "..."}`."""
    import json

    return json.dumps({"code": status, "message": message}).encode()
