"""The `desktop` template with the unmodified E2B Desktop SDK (`e2b-desktop`): a real screen, keystrokes that
arrive, the noVNC stream served through the gateway to a real browser, and a desktop that a pause or a fork
brings back as it was."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import CommandExitException
from e2b_desktop import Sandbox as Desktop
from PIL import Image, ImageChops

from tests.polling import wait_for
from tests.server_fixtures import RunningServer
from tests.ui_fixtures import browser_fixture, context_fixture

__all__ = ["browser_fixture", "context_fixture"]  # the fixtures `browser` and `context`, for the noVNC page


@pytest.fixture(scope="module")
def desktop(server: RunningServer) -> Iterator[Desktop]:
    sandbox = Desktop.create(timeout=300, **_options(server))
    yield sandbox
    sandbox.kill()


def _options(server: RunningServer) -> dict[str, str]:
    return {"api_key": server.api_key, "api_url": server.url, "sandbox_url": server.url}


def _screen(desktop: Desktop) -> Image.Image:
    return Image.open(io.BytesIO(desktop.screenshot()))


def _windows(desktop: Desktop, app: str) -> list[str]:
    """The app's windows (xdotool exits 1 while there is none)."""
    try:
        return list(desktop.get_application_windows(app))
    except CommandExitException:
        return []


def test_a_screenshot_is_a_png_of_the_screen_and_keystrokes_reach_a_terminal(desktop: Desktop) -> None:
    before = _screen(desktop)
    assert before.format == "PNG"
    assert before.size == desktop.get_screen_size()
    assert len(before.convert("RGB").getcolors(maxcolors=1 << 24) or []) > 1  # not a blank screen
    desktop.launch("xfce4-terminal")
    wait_for(lambda: _windows(desktop, "xfce4-terminal"), what="the terminal's window")
    desktop.write("echo typed-through-xdotool > /tmp/typed")
    desktop.press("enter")
    wait_for(
        lambda: desktop.commands.run("cat /tmp/typed 2>/dev/null || true").stdout == "typed-through-xdotool\n",
        what="the typed command to run",
    )
    assert _screen(desktop).tobytes() != before.tobytes()  # the terminal and its text are on screen
    desktop.left_click(5, 5)
    assert desktop.get_cursor_position() == (5, 5)


def test_the_stream_is_served_through_the_gateway_and_a_browser_connects(
    server: RunningServer, desktop: Desktop, context: Any
) -> None:
    desktop.stream.start()
    try:
        url = desktop.stream.get_url()
        assert url.startswith(f"https://6080-{desktop.sandbox_id}.sandbox.localhost/vnc.html?")
        page = context.new_page()
        page.goto(url.replace("https://", "http://").replace(".localhost/", f".localhost:{server.port}/", 1))
        page.wait_for_selector("html.noVNC_connected", timeout=30_000)
    finally:
        desktop.stream.stop()


def test_a_paused_desktop_comes_back_as_it_was(server: RunningServer, desktop: Desktop) -> None:
    """A pause is a CRIU snapshot (nothing of the sandbox runs), and the restore brings back the same X server,
    window manager and terminal, whose window still takes keystrokes."""
    probe = "pgrep -x Xvfb; pgrep -x xfwm4; pgrep -x xfce4-terminal"
    pids = desktop.commands.run(probe).stdout
    windows = _windows(desktop, "xfce4-terminal")
    assert windows  # the terminal the test before opened
    before = _screen(desktop).convert("RGB")
    assert desktop.pause()
    assert Desktop.get_info(desktop.sandbox_id, **_options(server)).state.value == "paused"
    assert (server.data_dir / "sandboxes" / desktop.sandbox_id / "checkpoint" / "inventory.img").is_file()
    resumed = Desktop.connect(desktop.sandbox_id, **_options(server))
    assert resumed.commands.run(probe).stdout == pids  # the same processes: restored, not restarted
    assert _windows(resumed, "xfce4-terminal") == windows
    after = _screen(resumed).convert("RGB")
    changed = sum(ImageChops.difference(before, after).convert("L").histogram()[1:])  # pixels that differ
    assert changed < before.width * before.height // 50  # the same screen (a clock may have ticked)
    resumed.press("escape")  # the test before clicked the Applications menu open: it has the keyboard
    resumed.commands.run(f"xdotool windowactivate --sync {windows[0]}")
    resumed.write("echo after-restore > /tmp/after-restore")
    resumed.press("enter")
    wait_for(lambda: resumed.files.exists("/tmp/after-restore"), what="the restored terminal to run a command")


def test_a_fork_of_a_desktop_has_its_screen_and_windows(desktop: Desktop) -> None:
    """A fork is a CRIU restore of the desktop into a new sandbox: its X server and terminal, not a fresh one."""
    probe = "pgrep -x Xvfb; pgrep -x xfce4-terminal"
    pids = desktop.commands.run(probe).stdout
    (fork,) = desktop.fork(count=1)
    assert isinstance(fork, Desktop), fork
    try:
        assert fork.commands.run(probe).stdout == pids
        assert _windows(fork, "xfce4-terminal") == _windows(desktop, "xfce4-terminal")
        assert fork.get_screen_size() == desktop.get_screen_size()
    finally:
        fork.kill()
