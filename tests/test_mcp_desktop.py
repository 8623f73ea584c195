"""The desktop tools of MCP's sandboxExecutor with the official MCP client: a screenshot comes back as image
content, and typing into a terminal the model opened changes the screen and runs the command."""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp_types import ImageContent
from PIL import Image

from tests.polling import wait_for_async
from tests.server_fixtures import RunningServer
from tests.test_mcp_server import call, create, execute, ok

pytestmark = pytest.mark.anyio


@pytest.fixture
async def desktop(server: RunningServer) -> AsyncIterator[dict[str, Any]]:
    created = await create(server, template="desktop")
    yield created
    await call(server, "deleteSandbox", {"sandboxId": created["sandboxId"]})


async def _screenshot(server: RunningServer, sandbox_id: str) -> tuple[dict[str, Any], Image.Image]:
    result = await execute(server, sandbox_id, "screenshot", {})
    figures = ok(result)
    images = [block for block in result.content if isinstance(block, ImageContent)]
    assert len(images) == 1
    assert images[0].mime_type == "image/png"
    assert "image" not in figures  # the PNG is the image content, not text
    return figures, Image.open(io.BytesIO(base64.b64decode(images[0].data)))


async def test_the_desktop_tools_see_and_drive_the_screen(server: RunningServer, desktop: dict[str, Any]) -> None:
    sandbox_id = desktop["sandboxId"]
    names = [tool["name"] for tool in desktop["tools"]]
    assert {"screenshot", "click", "type", "press", "scroll", "open_url"} <= set(names)
    figures, before = await _screenshot(server, sandbox_id)  # the first call starts the desktop
    assert before.size == (figures["width"], figures["height"]) == (1024, 768)
    opened = await execute(server, sandbox_id, "run_command", {
        "command": "xfce4-terminal >/dev/null 2>&1", "background": True, "envs": {"DISPLAY": ":0"},
    })  # fmt: skip
    ok(opened)

    async def terminal_focused() -> bool:
        probe = {"command": "xdotool getwindowname $(xdotool getwindowfocus)", "envs": {"DISPLAY": ":0"}}
        return "Terminal" in str(ok(await execute(server, sandbox_id, "run_command", probe))["stdout"])

    await wait_for_async(terminal_focused, what="the terminal's window to have the focus")
    ok(await execute(server, sandbox_id, "type", {"text": "echo typed-by-mcp > /tmp/mcp-typed"}))
    ok(await execute(server, sandbox_id, "press", {"keys": ["enter"]}))

    async def typed() -> bool:
        read = {"command": "cat /tmp/mcp-typed 2>/dev/null || true"}
        return bool(ok(await execute(server, sandbox_id, "run_command", read))["stdout"] == "typed-by-mcp\n")

    await wait_for_async(typed, what="the typed command to run")
    _, after = await _screenshot(server, sandbox_id)
    assert after.tobytes() != before.tobytes()
    assert ok(await execute(server, sandbox_id, "click", {"x": 10, "y": 10}))["clicked"] == [10, 10]
    where = {"command": "xdotool getmouselocation", "envs": {"DISPLAY": ":0"}}
    assert ok(await execute(server, sandbox_id, "run_command", where))["stdout"].startswith("x:10 y:10 ")
    assert ok(await execute(server, sandbox_id, "scroll", {"direction": "down", "amount": 2}))["amount"] == 2


async def test_other_templates_have_no_desktop_tools(server: RunningServer) -> None:
    created = await create(server, template="base")
    try:
        assert "screenshot" not in [tool["name"] for tool in created["tools"]]
    finally:
        await call(server, "deleteSandbox", {"sandboxId": created["sandboxId"]})


async def test_the_browser_tools_load_and_read_a_page_the_sandbox_serves(server: RunningServer) -> None:
    created = await create(server, template="browser")
    sandbox_id = created["sandboxId"]
    try:
        assert {"navigate", "evaluate", "page_text", "page_screenshot"} <= {tool["name"] for tool in created["tools"]}
        page = {"path": "/home/user/site/index.html", "content": "<title>From MCP</title><p>read me</p>"}
        ok(await execute(server, sandbox_id, "write_file", page))
        serve = {"command": "cd /home/user/site && python3 -m http.server 8000", "background": True}
        ok(await execute(server, sandbox_id, "run_command", serve))

        async def loaded() -> dict[str, Any] | None:
            result = await execute(server, sandbox_id, "navigate", {"url": "http://localhost:8000/"})
            return None if result.is_error else ok(result)

        navigated = await wait_for_async(loaded, what="the page to load in the sandbox's browser")
        assert navigated["title"] == "From MCP"
        assert ok(await execute(server, sandbox_id, "page_text", {}))["text"] == "read me"
        assert ok(await execute(server, sandbox_id, "evaluate", {"expression": "1 + 2"}))["value"] == 3
        shot = await execute(server, sandbox_id, "page_screenshot", {})
        assert [block.mime_type for block in shot.content if isinstance(block, ImageContent)] == ["image/png"]
        assert (ok(shot)["url"], ok(shot)["title"]) == ("http://localhost:8000/", "From MCP")
    finally:
        await call(server, "deleteSandbox", {"sandboxId": sandbox_id})
