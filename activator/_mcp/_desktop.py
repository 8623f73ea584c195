"""The desktop tools of `sandboxExecutor` (templates with `mcp_tools = ["desktop"]`): see and drive the sandbox's
X screen with the commands the E2B Desktop SDK runs (scrot, xdotool, xdg-open), so a model can check the
interface it built. The first call starts the desktop when nothing did yet: Xvfb on :0 and XFCE, as the SDK's
create does, so a sandbox made by `createSandbox` works the same as one the SDK made.

A screenshot is returned as MCP image content (the server turns the `image` entry into it), not as text.
"""

from __future__ import annotations

import base64
import shlex
import uuid
from typing import Any

from activator._mcp._arguments import Click, DesktopToolArgs, OpenUrl, Press, Screenshot, Scroll, TypeText
from activator._mcp._envd import Envd
from activator._mcp._errors import ToolError

__all__ = ["DESKTOP_TOOL_DESCRIPTIONS", "DESKTOP_VIEW_COMMAND", "MAX_SCREENSHOT_BYTES", "run_desktop_tool"]

MAX_SCREENSHOT_BYTES = 8 << 20
_DISPLAY = {"DISPLAY": ":0"}
_TIMEOUT = 30.0
# The SDK's own start-up (e2b_desktop Sandbox.create): the screen, then the session, waiting for each. One starter
# at a time (a lock: two viewers, or a viewer and a tool call, would start two), and each in a session of its own
# (`setsid -f`), so that killing the process that started them (a tool's deadline, a viewer leaving) leaves them.
_START = (
    "{ flock 9; xdpyinfo -display :0 >/dev/null 2>&1 || {"
    " setsid -f Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix >/tmp/xvfb.log 2>&1"
    " 9>&-;"
    " for i in $(seq 100); do xdpyinfo -display :0 >/dev/null 2>&1 && break; sleep 0.1; done;"
    " setsid -f startxfce4 >/tmp/xfce.log 2>&1 9>&-;"
    " for i in $(seq 300); do pgrep -x xfdesktop >/dev/null && break; sleep 0.2; done; }; } 9>/tmp/.desktop-start.lock"
)
# The web UI's live view: the desktop started as above, then an `x11vnc -inetd` (one per viewer) whose RFB is relayed
# to this process's stdin and stdout. x11vnc reads and writes its fd 0, which must be a socket, so a socketpair
# stands between it and the pipes envd gives. No port is opened in the sandbox (a port would be reachable through
# the gateway without the UI's session); the UI bridges its authenticated WebSocket to this process through envd.
_RELAY = """
import os, socket, subprocess, threading
ours, its = socket.socketpair()
vnc = subprocess.Popen(["x11vnc", "-inetd", "-display", ":0", "-nopw", "-q", "-o", "/tmp/x11vnc-view.log"],
                       stdin=its, stdout=its, stderr=subprocess.DEVNULL)
its.close()
def given():
    while data := os.read(0, 65536):
        ours.sendall(data)
    ours.shutdown(socket.SHUT_WR)
threading.Thread(target=given, daemon=True).start()
try:
    while data := ours.recv(65536):
        os.write(1, data)
finally:
    vnc.kill()
"""
DESKTOP_VIEW_COMMAND = f"{{ {_START}; }} >/dev/null 2>&1; exec python3 -c {shlex.quote(_RELAY)}"
_KEYS = {"enter": "Return", "return": "Return", "ctrl": "Control_L", "control": "Control_L", "alt": "Alt_L",
         "shift": "Shift_L", "esc": "Escape", "escape": "Escape", "tab": "Tab", "backspace": "BackSpace",
         "delete": "Delete", "space": "space", "up": "Up", "down": "Down", "left": "Left", "right": "Right",
         "super": "Super_L", "home": "Home", "end": "End", "pageup": "Page_Up", "pagedown": "Page_Down"}  # fmt: skip
_BUTTONS = {"left": 1, "middle": 2, "right": 3}

DESKTOP_TOOL_DESCRIPTIONS = {
    "screenshot": "A PNG of the sandbox's screen (returned as an image), with its width and height.",
    "click": "Move the mouse to (x, y) in screen pixels and click (left, middle or right; double: twice).",
    "type": "Type text on the keyboard into the focused window.",
    "press": 'Press keys together, e.g. ["enter"], ["ctrl", "c"], ["alt", "tab"] (xdotool key names too).',
    "scroll": "Scroll the mouse wheel up or down by `amount` steps where the mouse is.",
    "open_url": "Open a URL (in Chromium) or a file with its default application.",
}


async def run_desktop_tool(envd: Envd, args: DesktopToolArgs) -> dict[str, Any]:
    """Run one desktop tool: the desktop is started first when it is not running."""
    await _shell(envd, _START, kill_after=90.0)
    match args:
        case Screenshot():
            return await _screenshot(envd)
        case Click(x=x, y=y, button=button, double=double):
            repeat = "--repeat 2 " if double else ""
            await _shell(envd, f"xdotool mousemove --sync {x} {y} click {repeat}{_BUTTONS[button]}")
            return {"clicked": [x, y], "button": button, "double": double}
        case TypeText(text=text):
            await _shell(envd, f"xdotool type --delay 12 -- {shlex.quote(text)}", kill_after=_TIMEOUT + len(text) / 50)
            return {"typed": len(text)}
        case Press(keys=keys):
            combo = "+".join(_KEYS.get(key.lower(), key) for key in keys)
            await _shell(envd, f"xdotool key -- {shlex.quote(combo)}")
            return {"pressed": combo}
        case Scroll(direction=direction, amount=amount):
            await _shell(envd, f"xdotool click --repeat {amount} {4 if direction == 'up' else 5}")
            return {"scrolled": direction, "amount": amount}
        case OpenUrl(url=url):
            await _shell(envd, f"(xdg-open {shlex.quote(url)} >/tmp/xdg-open.log 2>&1 &)")
            return {"opened": url}


async def _screenshot(envd: Envd) -> dict[str, Any]:
    path = f"/tmp/screenshot-{uuid.uuid4().hex}.png"
    size = await _shell(envd, f"scrot --pointer {path} && xdpyinfo -display :0 | awk '/dimensions:/ {{print $2}}'")
    try:
        content = await envd.read_file(path, MAX_SCREENSHOT_BYTES)
    finally:
        await envd.run(f"rm -f {path}", cwd="", envs={}, kill_after=_TIMEOUT)  # its failure hides no other error
    if content.size > len(content.data):
        raise ToolError(f"the screenshot is larger than {MAX_SCREENSHOT_BYTES} bytes")
    width, _, height = size.strip().partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise ToolError(f"the desktop did not report its size (xdpyinfo said {size.strip()[:100]!r})")
    image = {"mimeType": "image/png", "data": base64.b64encode(content.data).decode()}
    return {"width": int(width), "height": int(height), "bytes": content.size, "image": image}


async def _shell(envd: Envd, command: str, *, kill_after: float = _TIMEOUT) -> str:
    output = await envd.run(command, cwd="", envs=_DISPLAY, kill_after=kill_after)
    if output.exit_code != 0:
        raise ToolError(f"the desktop did not do it (exit {output.exit_code}): {output.stderr.strip()[-500:]}")
    return output.stdout
