"""The one exception handler of the control plane: every error becomes E2B's `{"code", "message", "error_code"?}`.

ActivatorErrors carry their status; Litestar's HTTP errors (validation 400, auth 401, body too large 413, ...)
keep theirs, and their headers (a 405's `Allow`); anything else is logged with its traceback and answered 500
without it.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from activator._e2b._wire import ErrorBody
from activator._errors import ActivatorError, TooManyRequests, TooManySignIns

__all__ = ["e2b_error_response"]

_log = logging.getLogger("activator.e2b")


def e2b_error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorBody]:
    """E2B's JSON error body with the status the exception stands for."""
    status, message = _status_and_message(request, exc)
    error_code = exc.error_code if isinstance(exc, ActivatorError) else None
    headers = exc.headers if isinstance(exc, HTTPException) else None
    if isinstance(exc, TooManySignIns | TooManyRequests):
        headers = {"Retry-After": str(exc.retry_after)}
    return Response(ErrorBody(code=status, message=message, error_code=error_code), status_code=status, headers=headers)


def _status_and_message(request: Request[Any, Any, Any], exc: Exception) -> tuple[int, str]:
    match exc:
        case ActivatorError():
            return exc.status_code, exc.message
        case ValidationException(extra=list(problems)) if problems:
            return exc.status_code, f"{exc.detail}: {'; '.join(_problem(p) for p in problems)}"
        case HTTPException():
            return exc.status_code, exc.detail
    _log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return 500, "internal server error"


def _problem(problem: object) -> str:
    if isinstance(problem, dict) and problem.get("key"):
        return f"{problem['key']}: {problem.get('message')}"
    return str(problem.get("message") if isinstance(problem, dict) else problem)
