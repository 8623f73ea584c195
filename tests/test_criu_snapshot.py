"""CRIU snapshots of real sandboxes: processes and their memory end on snapshot and come back on restore.

Needs the CRIU that `scripts/build-criu` installs. Without it these tests skip, except under CI=true,
where they fail: CI must prove snapshots work.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from pool import LocalRuntime
from pool._local._criu import criu_dir, probe
from tests.runtime_fixtures import TEMPLATES, http_get, local_runtime, require_criu, sandbox_footprint, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

# An in-memory counter behind HTTP on 127.0.0.1:8008, with a 30 MiB heap so that "RAM released" shows.
_COUNTER = """
import http.server, os
heap = os.urandom(1 << 20) * 30
count = 0
class Counter(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global count
        count += 1
        body = f"{count} {os.getpid()} {len(heap)}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8008), Counter).serve_forever()
"""
_START_COUNTER = (
    f"cat > ~/counter.py <<'EOF'\n{_COUNTER}\nEOF\n"
    "echo kept > ~/marker.txt && (setsid python3 ~/counter.py </dev/null >~/counter.log 2>&1 &) "
    "&& for i in $(seq 100); do (echo > /dev/tcp/127.0.0.1/8008) 2>/dev/null && break; sleep 0.05; done"
)


async def _count(rt: LocalRuntime, sandbox_id: str) -> tuple[int, int]:
    """GET the counter: (count, the server's pid inside)."""
    count, pid, heap = (await http_get(rt, sandbox_id, 8008)).split()
    assert int(heap) == 30 << 20
    return int(count), int(pid)


async def _start_counter(rt: LocalRuntime, sandbox_id: str, *, token: str | None = None) -> tuple[int, int]:
    await rt.start(spec(sandbox_id, access_token=token))
    started = await run_in_sandbox(rt, sandbox_id, _START_COUNTER, token=token)
    assert started.exit_code == 0, started
    return await _count(rt, sandbox_id)


async def _snapshot_cycles(tmp_path: Path, cycles: int) -> None:
    require_criu()

    async with local_runtime(tmp_path) as rt:
        count, server_pid = await _start_counter(rt, "counter")
        assert count == 1
        for cycle in range(cycles):
            assert (await rt.stats("counter")).mem_used > 30 << 20
            info = await rt.snapshot("counter")
            assert info.kind == "criu"
            assert info.image_bytes > 30 << 20  # the heap went to disk
            assert sandbox_footprint(tmp_path, "counter") == ([], [])  # and left RAM: no process, no cgroup
            await rt.restore(spec("counter"))
            assert await _count(rt, "counter") == (count + 1, server_pid)
            count += 1
            files = await run_in_sandbox(rt, "counter", f"cat ~/marker.txt; echo {cycle} >> ~/cycles; cat ~/cycles")
            assert files.stdout.split() == ["kept", *map(str, range(cycle + 1))]


def test_probe_finds_a_working_criu() -> None:
    status = probe(criu_dir())
    if not status.available and os.environ.get("CI") != "true":
        pytest.skip(f"CRIU is not available here (run scripts/build-criu as root): {status.reason}")
    assert status.available, status.reason
    assert status.version.startswith("4."), status.version


async def test_snapshot_frees_the_sandbox_and_restore_brings_back_its_memory_and_files(tmp_path: Path) -> None:
    await _snapshot_cycles(tmp_path, 1)


async def test_two_snapshots_in_a_row(tmp_path: Path) -> None:
    await _snapshot_cycles(tmp_path, 2)


async def test_a_frozen_sandbox_is_snapshotted_with_its_memory(tmp_path: Path) -> None:
    require_criu()

    async with local_runtime(tmp_path) as rt:
        count, server_pid = await _start_counter(rt, "frozen")
        await rt.freeze("frozen")
        assert (await rt.snapshot("frozen")).kind == "criu"
        await rt.restore(spec("frozen"))
        assert not rt.is_frozen("frozen")
        assert await _count(rt, "frozen") == (count + 1, server_pid)


async def test_with_criu_any_sandbox_keeps_its_processes_and_capabilities_say_so(tmp_path: Path) -> None:
    require_criu()

    async with local_runtime(tmp_path) as rt:
        await _start_counter(rt, "anything")  # a process of the user's: CRIU keeps it anyway
        assert rt.snapshot_keeps_processes("anything")
        capabilities = rt.capabilities()
        assert capabilities.snapshot_kind == "criu", capabilities
        assert capabilities.criu_version.startswith("4.")


async def test_snapshot_and_restore_are_idempotent(tmp_path: Path) -> None:
    require_criu()

    async with local_runtime(tmp_path) as rt:
        await rt.start(spec("twice"))
        first = await rt.snapshot("twice")
        assert await rt.snapshot("twice") == first
        assert rt.is_snapshotted("twice")
        assert rt.snapshotted_ids() == {"twice"}
        await rt.restore(spec("twice"))
        pid = rt.host_pid("twice")
        await rt.restore(spec("twice"))
        assert rt.host_pid("twice") == pid
        assert not rt.is_snapshotted("twice")
        assert not (tmp_path / "sandboxes" / "twice" / "checkpoint").exists()  # stale once it runs again


async def test_a_connection_waiting_to_be_accepted_does_not_spoil_the_checkpoint(tmp_path: Path) -> None:
    require_criu()
    # Listens and never accepts: start's port probe stays in the accept queue ("in flight" for CRIU).
    never_accepts = msgspec.structs.replace(
        TEMPLATES["base"],
        start=("exec python3 -c 'import socket, time; s = socket.socket(); s.bind((\"127.0.0.1\", 8008)); "
               "s.listen(); time.sleep(1e6)'",),
        ports=(8008,),
    )  # fmt: skip

    async with local_runtime(tmp_path) as rt:
        await rt.start(spec("inflight", never_accepts))
        assert (await rt.snapshot("inflight")).kind == "criu"
        await rt.restore(spec("inflight", never_accepts))  # and the listener is back: restore probed it
