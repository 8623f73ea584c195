"""The UI's one exception handler: errors become a page (or JSON under `/ui/api/`), never a traceback.

SignInRequired on a page redirects to the sign-in form (and back afterwards); lifecycle and executor errors keep
their status and message; anything unexpected is logged with its traceback and answered 500 without it.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.response import Redirect

from activator import ActivatorError, AgentRefused, ToolError
from gateway.ui._auth import SignInRequired
from gateway.ui._context import UiContext
from gateway.ui._envd import EnvdError
from gateway.ui._render import page

__all__ = ["error_handler"]

_log = logging.getLogger("gateway.ui")


ErrorHandler = Callable[[Request[Any, Any, Any], Exception], Response[Any]]


def error_handler(ui: UiContext) -> ErrorHandler:
    """The handler for every exception raised under `/ui`."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        api = request.url.path.startswith("/ui/api/")
        if isinstance(exc, SignInRequired) and not api:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return Redirect("/ui/login?" + urllib.parse.urlencode({"next": target}), status_code=303)
        status, message = _status_and_message(request, exc)
        if api:
            return Response({"error": message}, status_code=status, headers={"Cache-Control": "no-store"})
        return page(ui, "error.html", session=None, status_code=status, status=status, message=message)

    return handle


def _status_and_message(request: Request[Any, Any, Any], exc: Exception) -> tuple[int, str]:
    match exc:
        case ActivatorError() | EnvdError():
            return exc.status_code, exc.message
        case HTTPException():
            return exc.status_code, exc.detail
        case AgentRefused() if exc.status in (400, 404, 409, 422):
            return exc.status, exc.message  # the agent server's own answer (no such session, a turn runs, ...)
        case ToolError():
            return 502, exc.message  # its token refused (not this browser's sign-in), or no answer
    _log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return 500, "Something went wrong on the server; the error is in its log."
