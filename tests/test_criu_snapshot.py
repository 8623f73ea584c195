"""CRIU snapshots of real sandboxes: processes and their memory end on checkpoint and come back on restore.

Needs the CRIU that `scripts/build-criu` installs. Without it these tests skip, except under CI=true,
where they fail: CI must prove snapshots work.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from pool import LocalRuntime
from pool._local._criu import CriuBinary, find_criu, probe
from pool._local._criu_sandbox import checkpoint, restore
from tests.runtime_fixtures import TEMPLATES, local_runtime, spec
from tests.sandbox_exec import run_in_sandbox

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


def _criu_or_skip() -> CriuBinary:
    status = probe()
    if not status.available:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CRIU must work in CI (run scripts/build-criu): {status.reason}")
        pytest.skip(f"CRIU is not available here (run scripts/build-criu as root): {status.reason}")
    return find_criu()


class _Snapshots:
    """Checkpoint and restore a LocalRuntime sandbox with the CRIU module, fixing up the runtime's record.

    This stands in for the runtime's own snapshot/resume until `_runtime.py` has them.
    """

    def __init__(self, runtime: LocalRuntime, criu: CriuBinary) -> None:
        self._rt = runtime
        self._criu = criu

    async def checkpoint(self, sandbox_id: str) -> tuple[int, int]:
        """Checkpoint; returns the sandbox's memory usage before and after, in bytes."""
        box = self._rt._sandboxes[sandbox_id]
        before = box.cgroup.usage().mem_used
        box.stopping = True  # not a crash
        await asyncio.to_thread(
            checkpoint, self._criu, sandbox_dir=box.directory, pid=box.pid, freezer=box.cgroup.freezer_path()
        )
        assert box.cgroup.pids() == []
        after = box.cgroup.usage().mem_used
        if box.process is not None:
            await asyncio.to_thread(box.process.wait)
            box.process = None
        else:
            with contextlib.suppress(ChildProcessError):  # a restored pid 1 is our child (we are a subreaper)
                await asyncio.to_thread(os.waitpid, box.pid, 0)
        os.close(box.netns_fd)
        box.netns_fd = -1
        box.cgroup.remove()
        return before, after

    async def restore(self, sandbox_id: str) -> None:
        box = self._rt._sandboxes[sandbox_id]
        box.cgroup.create(box.resources)
        box.pid = await asyncio.to_thread(
            restore,
            self._criu,
            sandbox_dir=box.directory,
            layers=self._rt.images.layer_dirs(TEMPLATES["base"]),
            userns_slot=box.slot,
            cgroup_procs=box.cgroup.procs_files(),
            freezer=box.cgroup.freezer_path(),
        )
        assert box.pid in box.cgroup.pids()
        box.netns_fd = os.open(f"/proc/{box.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        box.stopping = False
        self._rt._watch_exit(box)


async def _count(rt: LocalRuntime, sandbox_id: str) -> tuple[int, int]:
    """GET the counter: (count, the server's pid inside)."""
    reader, writer = await asyncio.open_connection(sock=await rt.open_socket(sandbox_id, 8008))
    writer.write(b"GET / HTTP/1.0\r\n\r\n")
    response = await reader.read()
    writer.close()
    assert response.startswith(b"HTTP/1.0 200"), response
    count, pid, heap = response.split(b"\r\n\r\n", 1)[1].split()
    assert int(heap) == 30 << 20
    return int(count), int(pid)


def _snapshot_cycles(tmp_path: Path, cycles: int) -> None:
    criu = _criu_or_skip()

    async def main() -> None:
        async with local_runtime(tmp_path) as rt:
            snapshots = _Snapshots(rt, criu)
            await rt.start(spec("counter"))
            started = await run_in_sandbox(rt, "counter", _START_COUNTER)
            assert started.exit_code == 0, started
            count, server_pid = await _count(rt, "counter")
            assert count == 1
            try:
                for cycle in range(cycles):
                    before, after = await snapshots.checkpoint("counter")
                    assert before - after > 25 << 20, (before, after)  # the 30 MiB heap is gone from RAM
                    await snapshots.restore("counter")
                    assert await _count(rt, "counter") == (count + 1, server_pid)
                    count += 1
                    files = await run_in_sandbox(
                        rt, "counter", f"cat ~/marker.txt; echo {cycle} >> ~/cycles; cat ~/cycles"
                    )
                    assert files.stdout.split() == ["kept", *map(str, range(cycle + 1))]
            finally:
                await rt.stop("counter")  # also reaps a restored pid 1

    asyncio.run(main())


def test_probe_finds_a_working_criu() -> None:
    status = probe()
    if not status.available and os.environ.get("CI") != "true":
        pytest.skip(f"CRIU is not available here (run scripts/build-criu as root): {status.reason}")
    assert status.available, status.reason
    assert status.version.startswith("4."), status.version


def test_checkpoint_frees_the_sandbox_and_restore_brings_back_its_memory_and_files(tmp_path: Path) -> None:
    _snapshot_cycles(tmp_path, 1)


def test_two_snapshots_in_a_row(tmp_path: Path) -> None:
    _snapshot_cycles(tmp_path, 2)
