"""Plain ASGI middleware that lets a held request notice its client leaving, without stealing its messages.

While the activator holds a request for a waking sandbox it awaits `activator.CLIENT_GONE` (set here, per
request, in the request's context) next to the wake-up. The watch reads the next ASGI message only once the
request has nothing left to send but a disconnect: an HTTP request whose body is complete, or a WebSocket
that has sent `websocket.connect` and is not accepted yet. What it reads is kept and handed to the app's next
`receive()`, so the proxy still sees every message exactly once. A request still uploading its body is not
watched (reading ahead would buffer the body); it waits for the wake-up or its deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from activator import CLIENT_GONE
from gateway._errors_response import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ClientWatch"]


class ClientWatch:
    """Wraps the app; per request it installs a `_Receiver` and points `CLIENT_GONE` at its `gone`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        receiver = _Receiver(receive)
        token = CLIENT_GONE.set(receiver.gone)
        try:
            await self.app(scope, receiver, send)
        finally:
            CLIENT_GONE.reset(token)


class _Receiver:
    """One request's `receive`, able to wait for the disconnect that is the only message left to come.

    Used by the request's own task only: the proxy's `receive()` calls and the hold's `gone()` never overlap,
    because the hold ends (and cancels `gone`) before the proxy reads again. Another task that inherited the
    request's context (a session's background task, say) outlives the request and must not read from it.
    """

    __slots__ = ("_kept", "_quiet", "_receive", "_task")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task = asyncio.current_task()  # the request's task: the only one `gone` answers for
        self._kept: Message | None = None  # a message `gone` read ahead, for the next `receive()`
        self._quiet = False  # nothing but a disconnect can come next

    async def __call__(self) -> Message:
        if self._kept is not None:
            message, self._kept = self._kept, None
            return message
        message = await self._receive()
        kind = message["type"]
        self._quiet = kind == "websocket.connect" or (kind == "http.request" and not message.get("more_body", False))
        return message

    def gone(self) -> Awaitable[None]:
        """Done once the client has disconnected; never done while that cannot be known (without buffering the
        body, or from another task)."""
        if asyncio.current_task() is not self._task:
            return asyncio.get_running_loop().create_future()
        return self._disconnect()

    async def _disconnect(self) -> None:
        if self._kept is None and self._quiet:
            self._kept = await self._receive()
        if self._kept is not None and self._kept["type"] in ("http.disconnect", "websocket.disconnect"):
            return
        await asyncio.Event().wait()  # cancelled by the hold when it ends
