"""The executor on the Python the sandbox images really have (Debian 12's 3.11.2), not the repository's.

The executor's other tests run it with the development interpreter, which may be newer: `tarfile.extractall(...,
filter=...)` (3.11.4+) passed there and failed every resume from zero on a real Kubernetes node. These tests run
it as every sandbox does, as pid 1 of a real sandbox on the image's own `/usr/bin/python3`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from websockets.asyncio.client import connect

from executor.agent_api import AGENT_PORT
from executor.envd import ENVD_PORT
from pool import ExecutorInit
from pool._executor_client import download_archive, upload_archive
from tests.runtime_fixtures import local_runtime, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
IMAGE_PYTHON = (3, 11, 2)  # Debian 12's python3 (3.11.2-1+b1), what the images install with debootstrap

_FILES = (
    "mkdir -p work/bin work/empty && echo hello > work/notes.txt && chmod 640 work/notes.txt"
    " && printf '#!/bin/sh\\necho tool\\n' > work/bin/tool && chmod 4755 work/bin/tool"
    " && ln -s /usr/bin/python3 work/bin/python && ln work/notes.txt work/hardlink"
)
_LISTING = "cd work && find . | sort | xargs stat -c '%n %F %a %U %h %N'"


async def test_the_sandbox_runs_the_images_python(tmp_path: Path) -> None:
    async with local_runtime(tmp_path) as runtime:
        await runtime.start(spec("imagepython"))
        result = await run_in_sandbox(runtime, "imagepython", "cat /proc/1/cmdline | tr '\\0' ' '; echo; python3 -V")
    cmdline, version = result.stdout.splitlines()
    assert cmdline.startswith("/usr/bin/python3 -I -S /opt/agent-sandbox/run-executor.py")
    assert version == "Python " + ".".join(map(str, IMAGE_PYTHON))


async def test_archive_round_trip_under_the_images_python(tmp_path: Path) -> None:
    """GET then PUT /agent-sandbox/archive restores a working directory exactly (modes, setuid, links, owners)."""
    async with local_runtime(tmp_path) as runtime:
        init = ExecutorInit(default_workdir="/home/user")  # what the archive holds, as on Kubernetes
        await runtime.start(msgspec.structs.replace(spec("imagearchive"), init=init))
        assert (await run_in_sandbox(runtime, "imagearchive", _FILES)).exit_code == 0
        before = (await run_in_sandbox(runtime, "imagearchive", _LISTING)).stdout
        sock = await runtime.open_socket("imagearchive", ENVD_PORT)
        archive = await download_archive(sock, None, limit=64 << 20)
        wiped = await run_in_sandbox(runtime, "imagearchive", "rm -rf work && ls")
        sock = await runtime.open_socket("imagearchive", ENVD_PORT)
        await upload_archive(sock, None, archive)
        after = (await run_in_sandbox(runtime, "imagearchive", _LISTING)).stdout
    assert "work" not in wiped.stdout
    assert "./bin/tool regular file 4755 user 1 " in before  # setuid
    assert "./bin/python symbolic link 777 user 1 './bin/python' -> '/usr/bin/python3'" in before
    assert "./notes.txt regular file 640 user 2 " in before  # hard-linked to ./hardlink
    assert after == before


_SET_XATTRS = (
    'mkdir -p work/dir && echo x > work/file && python3 -c "import os;'
    " os.setxattr('work/file', 'user.e2b.owner', b'alice'); os.setxattr('work/dir', 'user.raw', bytes([255, 0, 1]))\""
)
_XATTRS = (
    "python3 -c \"import os; print(sorted((p, n, os.getxattr(p, n).hex()) for p in ('work/file', 'work/dir')"
    ' for n in os.listxattr(p)))"'
)


async def test_user_xattrs_are_set_inside_a_sandbox_and_kept_by_the_archive(tmp_path: Path) -> None:
    """The writable layer (overlayfs over ext4, id-mapped) takes `user.*` xattrs from inside, and an archive
    packed and unpacked by the image's own Python brings them back byte for byte."""
    async with local_runtime(tmp_path) as runtime:
        init = ExecutorInit(default_workdir="/home/user")
        await runtime.start(msgspec.structs.replace(spec("imagexattrs"), init=init))
        made = await run_in_sandbox(runtime, "imagexattrs", _SET_XATTRS)
        assert made.exit_code == 0, made.stderr
        before = (await run_in_sandbox(runtime, "imagexattrs", _XATTRS)).stdout
        sock = await runtime.open_socket("imagexattrs", ENVD_PORT)
        archive = await download_archive(sock, None, limit=64 << 20)
        assert (await run_in_sandbox(runtime, "imagexattrs", "rm -rf work")).exit_code == 0
        sock = await runtime.open_socket("imagexattrs", ENVD_PORT)
        await upload_archive(sock, None, archive)
        after = (await run_in_sandbox(runtime, "imagexattrs", _XATTRS)).stdout
    assert before == "[('work/dir', 'user.raw', 'ff0001'), ('work/file', 'user.e2b.owner', '616c696365')]\n"
    assert after == before


def test_executor_needs_no_python_newer_than_the_images() -> None:
    """vermin finds no syntax or standard-library use that 3.11 lacks in the executor.

    Patch-level additions (a keyword argument new in 3.11.4) are below what any such tool knows: the two tests
    above, on the image's own interpreter, are what catches those.
    """
    target = ".".join(map(str, IMAGE_PYTHON[:2]))
    vermin = [
        str(Path(sys.executable).parent / "vermin"),
        f"--target={target}-",
        "--violations",
        "--no-tips",
        "--eval-annotations",
    ]
    result = subprocess.run([*vermin, str(REPO / "executor")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


async def test_the_terminal_websocket_under_the_images_python(tmp_path: Path) -> None:
    """The agent port's Upgrade handling and WebSocket frames (`executor._websocket`) as the image runs them."""
    async with local_runtime(tmp_path) as runtime:
        await runtime.start(spec("imagews"))
        loop = asyncio.get_running_loop()
        sock = await runtime.open_socket("imagews", AGENT_PORT)
        body = json.dumps({"command": "/bin/sh", "tty": True, "interactive": True}).encode()
        head = (
            f"POST /v1/processes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        )
        await loop.sock_sendall(sock, head.encode() + b"\r\nConnection: close\r\n\r\n" + body)
        answer = b""
        while chunk := await loop.sock_recv(sock, 65536):
            answer += chunk
        sock.close()
        process_id = json.loads(answer.partition(b"\r\n\r\n")[2])["id"]
        sock = await runtime.open_socket("imagews", AGENT_PORT)
        async with connect(f"ws://x/v1/processes/{process_id}/terminal/ws", sock=sock) as ws:
            assert json.loads(await ws.recv()) == {"type": "ready", "processId": process_id}
            await ws.send(json.dumps({"type": "input", "data": "echo $((6 * 7)); exit 5\n"}))
            seen, last = "", None
            async with asyncio.timeout(60):
                while not isinstance(last := await ws.recv(), str):
                    seen += last.decode(errors="replace")
            assert "42" in seen
            assert json.loads(last) == {"type": "exit", "exitCode": 5}
