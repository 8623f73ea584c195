"""Sign in with an API key, sign out.

The key is posted once, from the sign-in form, and exchanged for an opaque session id in a cookie that is
HttpOnly (no script reads it), SameSite=Strict, host-only (no Domain attribute, so sandbox hostnames under the
same domain never receive it), limited to `/ui`, and Secure when the UI is served over HTTPS. The key itself is
never stored: not in the cookie, not in the page, not in the session table (which keeps the key's id).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import Cookie
from litestar.enums import RequestEncodingType
from litestar.params import Body, QueryParameter
from litestar.response import Redirect

from activator import TooManySignIns
from gateway.ui._auth import COOKIE, Forbidden, connection_session
from gateway.ui._context import UiDep
from gateway.ui._render import page, safe_next
from gateway.ui._security import csrf_matches, same_origin

__all__ = ["LOGIN_ROUTES"]


class SignInForm(msgspec.Struct):
    key: str = ""
    next: str = ""


class SignOutForm(msgspec.Struct):
    csrf: str = ""


@get("/login")
async def sign_in_form(
    request: Request[Any, Any, Any], ui: UiDep, next_page: Annotated[str, QueryParameter(name="next")] = ""
) -> Response[Any]:
    """The sign-in form (or, when already signed in, where it would lead)."""
    if await connection_session(request, ui) is not None:
        return Redirect(safe_next(next_page), status_code=303)
    signed_out = request.query_params.get("signed_out") == "1"
    return page(ui, "login.html", session=None, next=safe_next(next_page), error="", signed_out=signed_out)


@post("/login", status_code=303)
async def sign_in(
    request: Request[Any, Any, Any],
    ui: UiDep,
    data: Annotated[SignInForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Response[Any]:
    """Exchange a valid key for a session cookie; a wrong key gets the form again (401), without the key in it, and
    an address that failed too many key checks lately gets it with a 429 and Retry-After (`ApiKeys.check`)."""
    if not same_origin(request.headers):
        raise Forbidden("refused: sign in from this server's own sign-in page")
    try:
        owner = await ui.services.keys.check(data.key.strip(), request.client.host if request.client else None)
    except TooManySignIns as exc:
        refused = page(ui, "login.html", session=None, next=safe_next(data.next), error=exc.message,
                       signed_out=False, status_code=429)  # fmt: skip
        refused.headers["Retry-After"] = str(exc.retry_after)
        return refused
    if owner is None:
        error = "That is not an API key of this server. Keys look like e2b_ followed by 32 hex digits."
        return page(ui, "login.html", session=None, next=safe_next(data.next), error=error, signed_out=False,
                    status_code=401)  # fmt: skip
    key = await ui.services.keys.get(owner)
    session_id = await ui.sessions.create(owner, key.name if key else "")
    cookie = Cookie(
        key=COOKIE, value=session_id, path="/ui", httponly=True, samesite="strict",
        secure=request.url.scheme == "https", max_age=int(ui.sessions.lifetime),
    )  # fmt: skip
    return Redirect(safe_next(data.next), status_code=303, cookies=[cookie])


@post("/logout", status_code=303)
async def sign_out(
    request: Request[Any, Any, Any],
    ui: UiDep,
    data: Annotated[SignOutForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Response[Any]:
    """End the session (its id stops working at once) and clear the cookie."""
    token = request.cookies.get(COOKIE)
    found = await ui.sessions.get(token)
    if found is not None and (not same_origin(request.headers) or not csrf_matches(found.csrf, data.csrf)):
        raise Forbidden("refused: sign out from this UI's own pages")
    await ui.sessions.drop(token)  # also when not found: with Redis unreachable, it is dropped there once it is back
    response: Response[Any] = Redirect("/ui/login?signed_out=1", status_code=303)
    response.delete_cookie(COOKIE, path="/ui")
    return response


LOGIN_ROUTES = [sign_in_form, sign_in, sign_out]
