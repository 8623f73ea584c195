"""SIGKILL the server and start it again on the same data directory: every sandbox is still there, as it was.

Three sandboxes, each running the counting server and holding a file: one frozen by the idle policy, one
snapshotted by E2B's pause, and one running (created just before the kill). After the restart each keeps its
state (the frozen one still reads as running), its files, and its server's in-memory count.

Only the frozen one's template idles (after 1 s): the others never do, however slow the machine and the restart.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
from e2b import Sandbox

from gateway._settings import DEFAULT_TEMPLATES
from tests.polling import wait_for
from tests.scale_to_zero_fixtures import criu_or_skip, http_get, sandboxes_by_state, start_counter
from tests.server_fixtures import RunningServer, point_e2b_at, running_server

pytestmark = pytest.mark.anyio

DOZES = 'name = "dozes"\nparent = "base"\npause_after = 1\n'  # base, frozen after 1 idle second


@pytest.fixture
def flags(tmp_path: Path) -> tuple[str, ...]:
    """Templates `base` (never idle) and `dozes`; idle sandboxes are never snapshotted."""
    templates = tmp_path / "templates"
    templates.mkdir()
    shutil.copy(DEFAULT_TEMPLATES / "base.toml", templates)
    (templates / "dozes.toml").write_text(DOZES)
    return ("--templates", str(templates), "--snapshot-after", "0")


async def _prepare(server: RunningServer, name: str, template: str = "base") -> Sandbox:
    sbx = Sandbox.create(template, timeout=300, metadata={"name": name})
    start_counter(sbx)
    sbx.files.write("/home/user/name.txt", name)
    assert (await http_get(server.port, sbx.sandbox_id, "/hit/x")).body == b"/hit/x 1"
    return sbx


def _use(monkeypatch: pytest.MonkeyPatch, server: RunningServer) -> None:
    point_e2b_at(server, monkeypatch)


async def test_sigkill_and_restart_keep_every_sandbox_its_files_and_its_memory(
    data_dir: Path, flags: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_server(data_dir, *flags) as first:
        _use(monkeypatch, first)
        criu_or_skip(first)
        frozen = await _prepare(first, "frozen", "dozes")
        wait_for(lambda: sandboxes_by_state(first)["paused"] == 1, what="the idle freeze")
        snapshotted = await _prepare(first, "snapshotted")
        assert snapshotted.pause()
        running = await _prepare(first, "running")
        assert sandboxes_by_state(first) == {"running": 1, "paused": 1, "snapshotted": 1}
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL  # killed, not stopped cleanly

        with running_server(data_dir, *flags) as second:
            _use(monkeypatch, second)
            assert sandboxes_by_state(second) == {"running": 1, "paused": 1, "snapshotted": 1}
            states = {s.metadata["name"]: s.state for s in Sandbox.list().next_items()}
            assert states == {"frozen": "running", "snapshotted": "paused", "running": "running"}
            Sandbox.connect(snapshotted.sandbox_id)
            for sbx, name in ((frozen, "frozen"), (snapshotted, "snapshotted"), (running, "running")):
                reply = await http_get(second.port, sbx.sandbox_id, "/hit/x")
                assert (name, reply.status, reply.body) == (name, 200, b"/hit/x 2")
                assert Sandbox.connect(sbx.sandbox_id).files.read("/home/user/name.txt") == name
