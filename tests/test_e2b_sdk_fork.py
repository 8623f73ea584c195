"""E2B's fork with the real `e2b` SDK: `sbx.fork(count=2)` gives sandboxes that go on from the source's memory
(a counter's count, its files), each independent of the others and of the source, which runs on untouched; each
has its own id and envd token. Needs CRIU (`require_criu`): forks keep memory, and nothing else is a fork."""

from __future__ import annotations

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox, SandboxException
from e2b.exceptions import NotFoundException

from tests.runtime_fixtures import require_criu
from tests.server_fixtures import RunningServer
from tests.test_criu_snapshot import _COUNTER

NOTE = "/home/user/note.txt"


@pytest.fixture(autouse=True)
def _criu() -> None:
    require_criu()


def _counter(sbx: Sandbox | AsyncSandbox, server: RunningServer) -> tuple[int, int]:
    """GET the sandbox's counter through the gateway: (count, the server's pid inside)."""
    response = httpx.get(f"http://{sbx.get_host(8008)}:{server.port}/", timeout=30)
    response.raise_for_status()
    count, pid, _heap = response.text.split()
    return int(count), int(pid)


def _start_counter(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/counter.py", _COUNTER)
    sbx.commands.run("python3 /home/user/counter.py", background=True)
    sbx.commands.run("for i in $(seq 200); do (echo > /dev/tcp/127.0.0.1/8008) 2>/dev/null && exit; sleep 0.05; done")


def test_forks_go_on_from_the_sources_memory_and_files_each_on_its_own(sbx: Sandbox, e2b_env: RunningServer) -> None:
    _start_counter(sbx)
    sbx.files.write(NOTE, "before the fork")
    count, pid = _counter(sbx, e2b_env)
    source_end = sbx.get_info().end_at

    forks = sbx.fork(count=2, timeout=120)

    try:
        assert all(isinstance(fork, Sandbox) for fork in forks), forks
        one, two = (fork for fork in forks if isinstance(fork, Sandbox))
        assert len({sbx.sandbox_id, one.sandbox_id, two.sandbox_id}) == 3
        assert _counter(one, e2b_env) == (count + 1, pid)  # its memory is the source's
        assert _counter(one, e2b_env) == (count + 2, pid)
        assert _counter(two, e2b_env) == (count + 1, pid)  # each counts on its own
        assert _counter(sbx, e2b_env) == (count + 1, pid)  # and the source ran on as it was
        assert sbx.get_info().end_at == source_end
        one.files.write(NOTE, "the first fork's")
        assert two.files.read(NOTE) == sbx.files.read(NOTE) == "before the fork"
        assert one.commands.run(f"stat -c %U {NOTE}; id -un").stdout.split() == ["user", "user"]
        assert {one.get_info().template_id, two.get_info().template_id} == {"base"}
        listed = {info.sandbox_id for info in Sandbox.list().next_items()}
        assert {one.sandbox_id, two.sandbox_id} <= listed
    finally:
        for fork in forks:
            if isinstance(fork, Sandbox):
                fork.kill()


def test_a_fork_has_its_own_envd_token_and_timeout(sbx: Sandbox, e2b_env: RunningServer) -> None:
    (fork,) = sbx.fork(timeout=120)
    assert isinstance(fork, Sandbox)
    try:
        assert fork._envd_access_token
        assert fork._envd_access_token != sbx._envd_access_token
        assert fork.commands.run("echo fork").stdout == "fork\n"
        envd = f"http://{fork.get_host(49983)}:{e2b_env.port}/envs"
        assert httpx.get(envd, headers={"X-Access-Token": str(sbx._envd_access_token)}).status_code == 401
        info = fork.get_info()
        assert 100 <= (info.end_at - info.started_at).total_seconds() <= 121
    finally:
        fork.kill()


@pytest.mark.anyio
async def test_the_async_sdk_forks_too(e2b_env: RunningServer) -> None:
    source = await AsyncSandbox.create(timeout=120)
    try:
        await source.files.write(NOTE, "async")
        (fork,) = await source.fork()  # no timeout: E2B's default for forks, 15 s
        assert isinstance(fork, AsyncSandbox)
        try:
            info = await fork.get_info()
            assert abs((info.end_at - info.started_at).total_seconds() - 15) < 1
            assert await fork.files.read(NOTE) == "async"
        finally:
            await fork.kill()
    finally:
        await source.kill()


def test_a_paused_or_unknown_sandbox_is_not_forked(sbx: Sandbox, e2b_env: RunningServer) -> None:
    with pytest.raises(NotFoundException):
        Sandbox.fork("nosuchsandbox000000")
    for count in (0, 21):
        refused = httpx.post(
            f"{e2b_env.url}/sandboxes/{sbx.sandbox_id}/fork",
            json={"count": count},
            headers={"X-API-Key": e2b_env.api_key},
        )
        assert refused.status_code == 400
        assert refused.json() == {"code": 400, "message": f"count must be between 1 and 20, not {count}"}
    sbx.pause()
    with pytest.raises(SandboxException, match=r"409: sandbox .* is paused: connect to it before forking it"):
        sbx.fork()
