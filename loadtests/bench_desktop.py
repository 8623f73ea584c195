"""Benchmark: desktop and browser sandboxes next to `base`, in one run.

Prints, per template where it applies:

- create → 201 cold (a server without warm pools) and from a warm pool (a second server with `--warm T=1`);
  for `desktop` also the E2B Desktop SDK's create (it starts Xvfb and XFCE itself) and its first screenshot;
- Playwright `connect_over_cdp` to a `browser` sandbox through the gateway, and a first page;
- pause → resume of a paused sandbox (an E2B pause snapshots every one of them to zero with CRIU);
- the first command to a sandbox the idle policy froze (a third server with `--pause-after 1`);
- memory (the sandbox's cgroup, from the metrics API) idle, and what a pause keeps of it.

Run as root:

    .venv/bin/python -m loadtests.bench_desktop --runs 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from e2b import Sandbox
from e2b_desktop import Sandbox as Desktop
from playwright.sync_api import sync_playwright

from loadtests._creates import timed_creates
from loadtests._stats import row
from tests.server_fixtures import RunningServer, running_server

_TEMPLATES = ("base", "browser", "desktop")


def _ms(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def _options(server: RunningServer) -> dict[str, Any]:
    return {"api_key": server.api_key, "api_url": server.url, "sandbox_url": server.url}


def _desktop_rounds(server: RunningServer, runs: int) -> tuple[list[float], list[float]]:
    creates, shots = [], []
    for _ in range(runs):
        began = time.perf_counter()
        desktop = Desktop.create(**_options(server))
        creates.append(_ms(began))
        began = time.perf_counter()
        desktop.screenshot()
        shots.append(_ms(began))
        desktop.kill()
    return creates, shots


def _cdp_rounds(server: RunningServer, runs: int) -> tuple[list[float], list[float]]:
    connects, pages = [], []
    with sync_playwright() as playwright:
        for _ in range(runs):
            sbx = Sandbox.create("browser", **_options(server))
            url = f"http://9222-{sbx.sandbox_id}.sandbox.localhost:{server.port}"
            began = time.perf_counter()
            browser = playwright.chromium.connect_over_cdp(
                url, headers={"e2b-traffic-access-token": sbx.traffic_access_token or ""}
            )
            connects.append(_ms(began))
            began = time.perf_counter()
            page = browser.contexts[0].new_page()
            page.set_content("<title>bench</title>")
            pages.append(_ms(began))
            browser.close()
            sbx.kill()
    return connects, pages


def _memory(sbx: Sandbox) -> float:
    samples = sbx.get_metrics()
    return samples[-1].mem_used / (1 << 20) if samples else float("nan")


def _pause_rounds(server: RunningServer, template: str, runs: int) -> tuple[list[float], list[float], float, str]:
    """Pause and resume times, the idle memory, and what the pause became (`paused` frozen, or `snapshotted`)."""
    resumes, pauses = [], []
    idle, kept = float("nan"), ""
    for _ in range(runs):
        sbx = (Desktop if template == "desktop" else Sandbox).create(template, **_options(server))
        time.sleep(2)  # let it settle: the figures are of an idle sandbox
        idle = _memory(sbx)
        began = time.perf_counter()
        sbx.pause()
        pauses.append(_ms(began))
        health = httpx.get(f"{server.url}/health").json()["sandboxes"]
        kept = "frozen: memory stays" if health.get("paused") else "snapshotted: 0 MiB resident"
        began = time.perf_counter()
        Sandbox.connect(sbx.sandbox_id, **_options(server)).commands.run("true")
        resumes.append(_ms(began))
        sbx.kill()
    return pauses, resumes, idle, kept


def _frozen_rounds(server: RunningServer, template: str, runs: int) -> list[float]:
    """The first command to a sandbox the idle policy froze: the wake (thaw) and the command, through the gateway."""
    firsts = []
    for _ in range(runs):
        sbx = (Desktop if template == "desktop" else Sandbox).create(template, **_options(server))
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.url}/health").json()["sandboxes"].get("paused", 0) < 1:
            if time.monotonic() > deadline:
                raise SystemExit(f"a {template} sandbox was not frozen by the idle policy within 60 s")
            time.sleep(0.2)
        began = time.perf_counter()
        sbx.commands.run("true")
        firsts.append(_ms(began))
        sbx.kill()
    return firsts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-desktop-") as tmp:
        with running_server(Path(tmp) / "cold") as cold:
            for template in _TEMPLATES:
                lines.append(row(f"{template}: create -> 201, cold", timed_creates(cold, template, args.runs)))
            creates, shots = _desktop_rounds(cold, args.runs)
            lines.append(row("desktop: e2b-desktop create (Xvfb + XFCE up)", creates))
            lines.append(row("desktop: first screenshot", shots))
            connects, pages = _cdp_rounds(cold, args.runs)
            lines.append(row("browser: Playwright connect_over_cdp", connects))
            lines.append(row("browser: new page + content", pages))
            for template in _TEMPLATES:
                pauses, resumes, idle, kept = _pause_rounds(cold, template, args.runs)
                lines.append(row(f"{template}: pause", pauses))
                lines.append(row(f"{template}: resume + first command", resumes))
                lines.append(f"{template + ': memory idle; while paused':<44} {idle:7.1f} MiB; {kept}")
        with running_server(Path(tmp) / "idle", "--pause-after", "1", "--snapshot-after", "0") as idling:
            for template in _TEMPLATES:
                lines.append(
                    row(f"{template}: frozen by idleness -> first command", _frozen_rounds(idling, template, args.runs))
                )
        warm_flags = [arg for template in _TEMPLATES for arg in ("--warm", f"{template}=1")]
        with running_server(Path(tmp) / "warm", *warm_flags) as warm:
            for template in _TEMPLATES:
                warm_creates = timed_creates(warm, template, args.runs, pool=template)
                lines.append(row(f"{template}: create -> 201, warm pool", warm_creates))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
