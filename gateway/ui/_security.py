"""The UI's defences against other sites, and in particular against pages served from sandbox hostnames.

A sandbox page at `<port>-<id>.<domain>` runs code the sandbox's user wrote, and when the UI is served on
`<domain>` or `api.<domain>` it is the *same site* as the UI: SameSite=Strict does not keep the session cookie
off its requests. So, besides the host-only cookie (no Domain attribute: it is never sent to a sandbox host):

- every state-changing request and the terminal's WebSocket must come from the UI's own origin (`Origin`, or
  `Referer` when a browser leaves `Origin` out), and carry the session's CSRF token;
- requests a browser marks `Sec-Fetch-Site: same-site` or `cross-site` are refused, except top-level
  navigations to pages (a link from elsewhere to `/ui/...` still opens the page);
- every response forbids framing and sniffing, and pages get a Content-Security-Policy that allows scripts from
  this origin only.
"""

from __future__ import annotations

import hmac
import urllib.parse
from collections.abc import Mapping

from gateway._errors_response import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SecurityHeaders", "csrf_matches", "same_origin"]

_CSP = (
    "default-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
    # xterm.js sizes its cells with a <style> element it writes at run time
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)
_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"content-security-policy", _CSP.encode()),
]
_FOREIGN_SITES = frozenset({b"same-site", b"cross-site"})
_FORBIDDEN = b'{"error": "refused: this request did not come from the agent-sandbox UI"}'


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether the request's `Origin` (or, without one, its `Referer`) names the host the request was sent to.

    Schemes are not compared: behind a TLS proxy the server may see http while the browser sends https.
    A request with neither header is refused, so non-browser clients must send `Origin` too.
    """
    host = headers.get("host", "").lower()
    source = headers.get("origin") or headers.get("referer")
    if not host or not source or source == "null":
        return False
    return urllib.parse.urlsplit(source).netloc.lower() == host


def csrf_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison of the session's CSRF token with the one the request carries."""
    return bool(given) and hmac.compare_digest(expected.encode(), (given or "").encode())


class SecurityHeaders:
    """ASGI middleware for the UI's routes: refuses foreign fetches (fetch metadata) and adds the headers above.

    Holds only configuration; the per-request `send` wrapper is a closure.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _foreign_fetch(scope):
            await _refuse(send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _foreign_fetch(scope: Scope) -> bool:
    """A request another site made, other than a plain navigation to a page (GET, `Sec-Fetch-Mode: navigate`)."""
    site = mode = b""
    for name, value in scope["headers"]:
        if name == b"sec-fetch-site":
            site = value
        elif name == b"sec-fetch-mode":
            mode = value
    if site not in _FOREIGN_SITES:
        return False
    page = scope["method"] == "GET" and not scope["path"].startswith(("/ui/api/", "/ui/static/"))
    return not (page and mode == b"navigate")


async def _refuse(send: Send) -> None:
    length = str(len(_FORBIDDEN)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", length), *_HEADERS]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": _FORBIDDEN})
