"""`/v1/desktop/*`: upstream's desktop API reports what this sandbox has, and refuses what needs a running one.

`GET /v1/desktop/status` says `active` when an X display answers (the `desktop` template's Xvfb on :0),
`inactive` otherwise; every other desktop route is 409 `desktop_runtime_inactive` without a display, and
501 with one, since the desktop is driven through envd (the E2B Desktop SDK) and the MCP desktop tools.
"""

from __future__ import annotations

import asyncio
import os
import shutil

from executor._agents._http import ApiError, send_json
from executor._exchange import Request, Response

__all__ = ("DesktopRoutes",)

DISPLAY = ":0"
REQUIRED = ("Xvfb", "xdotool", "scrot")


def _display_active() -> bool:
    return os.path.exists(f"/tmp/.X11-unix/X{DISPLAY.lstrip(':')}")


class DesktopRoutes:
    async def status(self, request: Request, response: Response) -> None:
        missing = [command for command in REQUIRED if shutil.which(command) is None]
        active = await asyncio.to_thread(_display_active)
        body: dict[str, object] = {"state": "active" if active else "inactive", "missingDependencies": missing}
        if active:
            body["display"] = DISPLAY
        await send_json(response, 200, body)

    async def other(self, request: Request, response: Response, rest: str = "") -> None:
        if not await asyncio.to_thread(_display_active):
            raise ApiError("desktop_runtime_inactive", 409, "desktop runtime is not active: use the desktop template")
        detail = "drive this desktop with the E2B Desktop SDK or the MCP desktop tools: /v1/desktop/* reports status"
        raise ApiError("not_implemented", 501, detail)
