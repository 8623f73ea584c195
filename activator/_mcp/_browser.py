"""The browser tools of `sandboxExecutor` (templates with `mcp_tools = ["browser"]`): drive the sandbox's
Chromium over the DevTools protocol on its port 9222, from the server, so a model can look at a page.

Each call finds the first page target (`/json/list`, with the `Host: localhost` Chromium insists on), opens its
WebSocket over a fresh socket into the sandbox, sends one or two CDP commands and closes. The page lives on in
the browser between calls, so `navigate` then `page_text` reads what was loaded.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from websockets.asyncio.client import connect as websocket_connect
from websockets.exceptions import WebSocketException

from activator._mcp._arguments import BrowserToolArgs, Evaluate, Navigate, PageScreenshot, PageText
from activator._mcp._desktop import MAX_SCREENSHOT_BYTES
from activator._mcp._errors import ToolError, executor_failures
from activator._mcp._output import MAX_STREAM_BYTES
from pool import envd

__all__ = ["BROWSER_TOOL_DESCRIPTIONS", "CDP_PORT", "current_page", "navigate", "run_browser_tool"]

CDP_PORT = 9222
_LOCAL = f"localhost:{CDP_PORT}"
_TIMEOUT = 30.0
_MAX_MESSAGE = 16 << 20  # a screenshot of a large page
_MAX_SCREENSHOT_BASE64 = (MAX_SCREENSHOT_BYTES + 2) // 3 * 4
_MAX_URL = 8192  # characters of a page's URL, and of its title, that are answered
_MAX_TITLE = 1024
_LOADED = (
    "new Promise(r => document.readyState === 'complete' ? r() : addEventListener('load', () => r(), {once: true}))"
)

BROWSER_TOOL_DESCRIPTIONS = {
    "navigate": "Load a URL in the sandbox's browser (http://localhost:<port> is a server in the sandbox) and "
    "wait until the page has loaded; returns its final URL and title.",
    "evaluate": "Evaluate a JavaScript expression in the current page (awaited if it is a promise); returns its "
    "value as JSON.",
    "page_text": f"The visible text of the current page (its URL and title too), at most {MAX_STREAM_BYTES // 1024} "
    "KiB.",
    "page_screenshot": "A PNG of the current page's viewport (returned as an image), with its URL and title.",
}


class _Target(msgspec.Struct):
    type: str
    webSocketDebuggerUrl: str = ""  # noqa: N815 - Chromium's name


Connect = Callable[[int], Awaitable[socket.socket]]


async def run_browser_tool(connect: Connect, args: BrowserToolArgs) -> dict[str, Any]:
    """Run one browser tool against the first page of the sandbox's Chromium."""
    try:
        async with asyncio.timeout(_TIMEOUT):
            with executor_failures():
                return await _run(connect, args)
    except TimeoutError as exc:
        raise ToolError(f"the browser did not answer within {_TIMEOUT:g} s") from exc
    except (OSError, WebSocketException) as exc:
        raise ToolError(f"the browser's DevTools port ({CDP_PORT}) did not answer: {exc}") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ToolError(f"the browser's DevTools port answered something that is not CDP: {exc}") from exc


async def _run(connect: Connect, args: BrowserToolArgs) -> dict[str, Any]:
    page = await _page(connect)
    async with websocket_connect(page, sock=await connect(CDP_PORT), max_size=_MAX_MESSAGE) as cdp:
        session = _Cdp(cdp)
        match args:
            case Navigate(url=url):
                navigated = await session.call("Page.navigate", {"url": url})
                if navigated.get("errorText"):
                    raise ToolError(f"the browser could not load {url}: {navigated['errorText']}")
                await session.evaluate(_LOADED)
                return await session.where()
            case Evaluate(expression=expression):
                value = await session.evaluate(expression)
                if len(msgspec.json.encode(value)) > MAX_STREAM_BYTES:
                    raise ToolError(f"the value is larger than {MAX_STREAM_BYTES} bytes as JSON: return a part of it")
                return {"value": value}
            case PageText():
                text = str(await session.evaluate("document.body ? document.body.innerText : ''"))
                cut = text.encode()[:MAX_STREAM_BYTES].decode(errors="ignore")
                note = {"note": f"cut to {MAX_STREAM_BYTES} bytes"} if cut != text else {}
                return await session.where() | {"text": cut} | note
            case PageScreenshot():
                shot = await session.call("Page.captureScreenshot", {"format": "png"})
                if not isinstance(shot.get("data"), str):
                    raise ToolError("the browser sent no screenshot")
                if len(shot["data"]) > _MAX_SCREENSHOT_BASE64:
                    raise ToolError(f"the screenshot is larger than {MAX_SCREENSHOT_BYTES} bytes")
                return await session.where() | {"image": {"mimeType": "image/png", "data": shot["data"]}}


async def current_page(connect: Connect) -> dict[str, Any]:
    """The browser's current page as the web UI shows it: `{url, title, image: {mimeType, data}}` (a PNG of its
    viewport, base64); ToolError as the tools."""
    return await run_browser_tool(connect, PageScreenshot())


async def navigate(connect: Connect, url: str) -> dict[str, Any]:
    """Load `url` in the browser's current page and wait for it: `{url, title}`; ToolError as the tools."""
    return await run_browser_tool(connect, Navigate(url=url))


async def _page(connect: Connect) -> str:
    """The DevTools WebSocket URL of the browser's first page."""
    sock = await connect(CDP_PORT)
    async with envd.exchange(sock, "GET", "/json/list", {"Host": _LOCAL}) as response:
        body = await response.prefix(1 << 20)
    if response.status != 200:
        raise ToolError(f"the browser's DevTools answered {response.status}: {body[:300]!r}")
    pages = [t for t in msgspec.json.decode(body, type=list[_Target]) if t.type == "page" and t.webSocketDebuggerUrl]
    if not pages:
        raise ToolError("the browser has no page open")
    return pages[0].webSocketDebuggerUrl


class _Cdp:
    """One CDP connection: commands with increasing ids; events in between are skipped."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._id = 0

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        command = {"id": self._id, "method": method, "params": params or {}}
        await self._socket.send(msgspec.json.encode(command).decode())
        while True:
            message = msgspec.json.decode(await self._socket.recv())
            if isinstance(message, dict) and message.get("id") == self._id:
                if "error" in message:
                    error = message["error"]
                    raise ToolError(f"{method}: {error.get('message', error) if isinstance(error, dict) else error}")
                result = message.get("result", {})
                if not isinstance(result, dict):
                    raise ToolError(f"{method}: the browser answered something that is not CDP")
                return result

    async def where(self) -> dict[str, Any]:
        """The page's URL and title."""
        url = await self.evaluate(f"String(location.href).slice(0, {_MAX_URL})")
        title = await self.evaluate(f"String(document.title).slice(0, {_MAX_TITLE})")
        return {"url": str(url)[:_MAX_URL], "title": str(title)[:_MAX_TITLE]}  # the page's, so bounded here too

    async def evaluate(self, expression: str) -> Any:
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        result = await self.call("Runtime.evaluate", params)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise ToolError(f"the expression threw: {details.get('exception', {}).get('description', details)}")
        value = result.get("result", {})
        # NaN, Infinity, -0 and BigInts have no JSON form: CDP sends them as text.
        return value.get("value", value.get("unserializableValue"))
