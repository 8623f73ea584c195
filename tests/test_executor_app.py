"""The plain endpoints: /health, /init, /envs, /metrics, and stopping the executor."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from executor._metrics import Metrics
from tests.executor_fixtures import Envd, envd_fixture, run_executor  # noqa: F401 - fixtures

METRICS = {"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "mem_total_mib", "mem_used_mib"}


@pytest.fixture
def fresh() -> Iterator[Envd]:
    """An executor of its own: these tests change its token and defaults."""
    with run_executor() as running:
        yield running


def test_health_needs_no_token(envd: Envd) -> None:
    with envd.client(**{"X-Access-Token": "wrong"}) as client:
        assert client.get("/health").status_code == 204


def test_envs_and_metrics_need_the_token(envd: Envd) -> None:
    with envd.client(**{"X-Access-Token": "wrong"}) as client:
        assert client.get("/envs").status_code == client.get("/metrics").status_code == 401


def test_metrics_report_cpu_memory_and_disk(envd: Envd) -> None:
    with envd.client() as client:
        client.get("/metrics")
        metrics = client.get("/metrics").json()
    assert METRICS | {"disk_used", "disk_total"} <= set(metrics)
    assert metrics["mem_total"] >= metrics["mem_used"] > 0
    assert 0 <= metrics["cpu_used_pct"] <= 100


def test_metrics_report_the_sandboxs_own_limits_not_the_hosts(envd: Envd) -> None:
    """The `base` template's 1 CPU and 1024 MiB, read from the sandbox's own cgroup at /sys/fs/cgroup."""
    with envd.client() as client:
        metrics = client.get("/metrics").json()
    assert (metrics["cpu_count"], metrics["mem_total"], metrics["mem_total_mib"]) == (1, 1024 << 20, 1024)
    assert 0 < metrics["mem_used"] < metrics["mem_total"]


def _cgroup(root: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


@pytest.mark.parametrize(
    "files",
    [
        {"cpu.max": "150000 100000\n", "cpu.stat": "usage_usec 5\n", "memory.max": "536870912\n",
         "memory.current": "1048576\n", "memory.stat": "anon 1\nfile 4096\n"},
        {"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n", "cpuacct/cpuacct.usage": "5000\n",
         "memory/memory.limit_in_bytes": "536870912\n", "memory/memory.usage_in_bytes": "1048576\n",
         "memory/memory.stat": "cache 4096\nrss 1\n"},
    ],
    ids=["cgroup v2", "cgroup v1"],
)  # fmt: skip
def test_metrics_read_either_cgroup_layout(tmp_path: Path, files: dict[str, str]) -> None:
    metrics = Metrics(_cgroup(tmp_path, files)).snapshot()
    assert (metrics["cpu_count"], metrics["mem_total"], metrics["mem_used"], metrics["mem_cache"]) == (
        2, 512 << 20, 1 << 20, 4096
    )  # fmt: skip


def test_metrics_without_a_cgroup_limit_fall_back_to_the_machine(tmp_path: Path) -> None:
    unlimited = {"cpu.max": "max 100000\n", "memory.max": "max\n", "memory.current": "1048576\n"}
    metrics = Metrics(_cgroup(tmp_path, unlimited)).snapshot()
    assert (metrics["cpu_count"], metrics["mem_used"]) == (os.cpu_count(), 1 << 20)
    assert metrics["mem_total"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_init_env_vars_reach_new_processes_and_requests_override_them(fresh: Envd) -> None:
    with fresh.client() as client:
        assert client.post("/init", json={"envVars": {"FROM_INIT": "yes", "BOTH": "init"}}).status_code == 204
        assert client.get("/envs").json() == {"FROM_INIT": "yes", "BOTH": "init"}
    result = fresh.sandbox().commands.run('echo "$FROM_INIT $BOTH"', envs={"BOTH": "request"})
    assert result.stdout == "yes request\n"


def test_init_replaces_the_token_and_requires_the_current_one(fresh: Envd) -> None:
    with fresh.client(**{"X-Access-Token": ""}) as anonymous:
        assert anonymous.post("/init", json={"accessToken": "stolen"}).status_code == 401
    with fresh.client() as client:
        assert client.post("/init", json={"accessToken": "second-token"}).status_code == 204
        assert client.get("/envs").status_code == 401
    with fresh.client(**{"X-Access-Token": "second-token"}) as client:
        assert client.get("/envs").status_code == 200


def test_init_before_any_token_is_open_then_closes() -> None:
    with run_executor(access_token=None) as open_executor, open_executor.client() as client:
        assert client.post("/process.Process/List", json={}).status_code == 200
        assert client.post("/init", json={"accessToken": "now-set"}).status_code == 204
        assert client.post("/process.Process/List", json={}).status_code == 401


def test_init_with_an_unknown_default_user_is_400_and_changes_nothing(fresh: Envd) -> None:
    with fresh.client() as client:
        response = client.post("/init", json={"envVars": {"X": "1"}, "defaultUser": "no-such-user"})
        assert (response.status_code, response.json()["code"]) == (400, 400)
        assert client.get("/envs").json() == {}
        assert client.post("/init", content=b"[not json").status_code == 400


def test_default_user_and_workdir_come_from_init(fresh: Envd) -> None:
    with fresh.client() as client:
        assert client.post("/init", json={"defaultUser": "nobody", "defaultWorkdir": "/tmp"}).status_code == 204
    assert fresh.sandbox().commands.run("id -un; pwd").stdout == "nobody\n/tmp\n"


def test_sigterm_kills_and_reaps_the_processes_then_exits_zero() -> None:
    """Looks at the host's process table: this one is about the executor process itself."""
    with run_executor() as running:
        handle = running.sandbox().commands.run("echo ready; sleep 300", background=True, timeout=0)
        next(iter(handle))
        assert running.stop() == 0
        with pytest.raises(ProcessLookupError):
            os.kill(handle.pid, 0)


# Run in a process of its own: serving installs a SIGCHLD reaper that would take other tests' children.
_SERVE_UNTIL_TERMINATED = """
import asyncio, os, signal, sys
from executor._app import App, Settings
from executor._defaults import Defaults
from executor._main import _serve
from executor._reaper import Reaper

async def serve_until_terminated() -> int:
    ready, ready_w = os.pipe()
    app = App(Settings(agent_state_dir=sys.argv[1]), Defaults(user="root"), Reaper())
    serving = asyncio.create_task(_serve("127.0.0.1", (0, 0), ready_w, app))
    await asyncio.to_thread(os.read, ready, 16)
    os.kill(os.getpid(), signal.SIGTERM)
    return await serving

loop = asyncio.new_event_loop()
code = loop.run_until_complete(serve_until_terminated())
print(code, signal.set_wakeup_fd(-1), signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL)
loop.close()
"""


def test_serving_leaves_no_signal_handler_for_the_loop_to_close_over(tmp_path: Path) -> None:
    """`loop.close()` closes its wakeup pipe before it removes signal handlers: a child dying in between
    had its SIGCHLD written to a closed fd, and CPython printed a traceback into the executor's log."""
    done = subprocess.run(
        [sys.executable, "-c", _SERVE_UNTIL_TERMINATED, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.split()) == (0, ["0", "-1", "True"]), done.stderr


def test_home_flag_gives_every_user_that_home(tmp_path: Path) -> None:
    """`--home` (the dev cluster's pods): HOME of commands, their working directory, the base of relative paths."""
    with run_executor("--home", str(tmp_path)) as running:
        sbx = running.sandbox()
        assert sbx.commands.run("echo $HOME; pwd", user="root").stdout.split() == [str(tmp_path)] * 2
        sbx.files.write("relative.txt", "in the home", user="root")
        assert (tmp_path / "relative.txt").read_text() == "in the home"
