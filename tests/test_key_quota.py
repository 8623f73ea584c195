"""Per-key limits (`_quota`) and the sandboxes' host ceiling: a create past its key's limits is answered as E2B
answers a full team (429, RateLimitException in the SDK, a tool error over MCP) and starts nothing, concurrent
creates never overshoot, `keys update` applies to the next create, and the parent cgroup has its ceiling."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import RateLimitException, Sandbox

from activator import ApiKeys, KeyLimits, QuotaExceeded, SandboxRecord, Store
from gateway import ServeSettings
from pool import HostCeiling, SandboxSpec
from pool._local._cgroups import cgroup_root_for, write_ceiling
from tests import test_activator_fakes as fakes
from tests.key_fixtures import create_key, keys_command
from tests.runtime_fixtures import require_criu
from tests.server_fixtures import RunningServer, server_in_temp_dir
from tests.test_mcp_server import call, failed, ok
from tests.ui_fixtures import sdk_options

store = fakes.store  # the shared fixture, bound by name for pytest
FULL = "you have reached the maximum number of concurrent E2B sandboxes"


class HeldRuntime(fakes.FakeRuntime):
    """A fake runtime whose starts all wait for `release`, so that every create is in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def start(self, spec: SandboxSpec) -> None:
        await self.release.wait()
        await super().start(spec)


async def _outcomes(creates: list[asyncio.Task[SandboxRecord]]) -> tuple[list[SandboxRecord], list[str]]:
    done = await asyncio.gather(*creates, return_exceptions=True)
    refused = [str(exc) for exc in done if isinstance(exc, QuotaExceeded)]
    return [record for record in done if isinstance(record, SandboxRecord)], refused


@pytest.mark.anyio
async def test_concurrent_creates_of_one_key_never_pass_its_limit(store: Store) -> None:
    runtime, keys = HeldRuntime(), ApiKeys(store)
    key, _ = await keys.create("tenant", KeyLimits(max_sandboxes=3))
    act = fakes.activator(store, runtime, fakes.Clock())
    creates = [asyncio.create_task(act.create(key.id, fakes.request())) for _ in range(8)]
    await asyncio.sleep(0.05)  # every create has been admitted or refused; the admitted ones wait in `start`
    runtime.release.set()
    created, refused = await _outcomes(creates)
    assert (len(created), len(refused), len(runtime.running)) == (3, 5, 3)
    assert all(message.startswith(f"{FULL} (3).") for message in refused)
    assert (await act.create("another-key", fakes.request())).owner == "another-key"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (KeyLimits(max_memory_mb=2048), "maximum memory of concurrent E2B sandboxes (2048 MiB"),
        (KeyLimits(max_vcpus=5), "maximum vCPUs of concurrent E2B sandboxes (5;"),
    ],
    ids=["memory", "vcpus"],
)
async def test_memory_and_vcpus_are_summed_over_the_keys_sandboxes(
    store: Store, limits: KeyLimits, message: str
) -> None:
    key, _ = await ApiKeys(store).create("tenant", limits)  # the template declares 1024 MiB and 2 vCPUs
    act = fakes.activator(store, fakes.FakeRuntime(), fakes.Clock())
    for _ in range(2):
        await act.create(key.id, fakes.request())
    with pytest.raises(QuotaExceeded, match=re.escape(message)):
        await act.create(key.id, fakes.request())


@pytest.mark.anyio
async def test_paused_and_snapshotted_sandboxes_count_until_killed(store: Store) -> None:
    key, _ = await ApiKeys(store).create("tenant", KeyLimits(max_sandboxes=2))
    act = fakes.activator(store, fakes.FakeRuntime(), fakes.Clock())
    paused, _ = [await act.create(key.id, fakes.request()) for _ in range(2)]
    await act.pause(key.id, paused.id)  # E2B's pause: snapshotted
    with pytest.raises(QuotaExceeded):
        await act.create(key.id, fakes.request())
    await act.connect(key.id, paused.id, 60)  # a resume needs no room: it already counts
    await act.kill(key.id, paused.id)
    await act.create(key.id, fakes.request())


@pytest.mark.anyio
async def test_updated_limits_and_the_servers_defaults_apply_to_the_next_create(store: Store) -> None:
    keys = ApiKeys(store)
    key, _ = await keys.create("tenant")
    act = fakes.activator(store, fakes.FakeRuntime(), fakes.Clock(), key_limits={"max_sandboxes": 1})
    await act.create(key.id, fakes.request())
    with pytest.raises(QuotaExceeded, match=r"\(1\)"):
        await act.create(key.id, fakes.request())
    assert await keys.update(key.id, KeyLimits(max_sandboxes=0))  # unlimited, over the server's 1
    for _ in range(3):
        await act.create(key.id, fakes.request())


@pytest.fixture(scope="module")
def quota_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    flags = ["--key-max-sandboxes", "2", "--sandboxes-memory-max", "6144", "--sandboxes-pids-max", "4000"]
    with server_in_temp_dir(tmp_path_factory, "quota", *flags) as running:
        yield running


def _create(server: RunningServer, key: str) -> Sandbox | RateLimitException:
    try:
        return Sandbox.create(**sdk_options(server, key))
    except RateLimitException as exc:
        return exc


def test_the_sdk_gets_rate_limited_past_the_limit_and_keys_update_lifts_it(quota_server: RunningServer) -> None:
    key, key_id = create_key(quota_server, "--name", "tenant")
    with ThreadPoolExecutor(5) as threads:
        outcomes = list(threads.map(lambda _: _create(quota_server, key), range(5)))
    created = [outcome for outcome in outcomes if isinstance(outcome, Sandbox)]
    try:
        refused = [str(outcome) for outcome in outcomes if isinstance(outcome, RateLimitException)]
        assert (len(created), len(refused)) == (2, 3)
        assert all(f"429: Rate limit exceeded, please try again later. - {FULL} (2)." in m for m in refused)
        listed = httpx.get(f"{quota_server.url}/v2/sandboxes", headers={"X-API-Key": key}).json()
        assert len(listed) == 2
        assert "max-sandboxes 3" in keys_command(quota_server, "update", key_id, "--max-sandboxes", "3")
        created.append(Sandbox.create(**sdk_options(quota_server, key)))
        assert isinstance(_create(quota_server, key), RateLimitException)
    finally:
        for sandbox in created:
            sandbox.kill()


def test_a_fork_past_the_limit_is_refused_in_its_place_and_the_others_start(quota_server: RunningServer) -> None:
    require_criu()
    key, _ = create_key(quota_server, "--max-sandboxes", "2")
    source = Sandbox.create(**sdk_options(quota_server, key))
    try:
        forks = source.fork(count=2)
        started = [fork for fork in forks if isinstance(fork, Sandbox)]
        try:
            assert len(started) == 1
            refused = [str(fork) for fork in forks if isinstance(fork, RateLimitException)]
            assert len(refused) == 1
            assert f"{FULL} (2)." in refused[0]
            assert started[0].commands.run("echo forked").stdout == "forked\n"
        finally:
            for fork in started:
                fork.kill()
    finally:
        source.kill()


@pytest.mark.anyio
async def test_mcp_create_past_the_limit_is_a_tool_error(quota_server: RunningServer) -> None:
    key, _ = create_key(quota_server, "--max-sandboxes", "1")
    first = ok(await call(quota_server, "createSandbox", {"template": "base"}, key=key))
    try:
        assert failed(await call(quota_server, "createSandbox", {"template": "base"}, key=key)).startswith(
            f"{FULL} (1)."
        )
    finally:
        await call(quota_server, "deleteSandbox", {"sandboxId": first["sandboxId"]}, key=key)


def _ceiling(data_dir: Path) -> tuple[int, str]:
    """(memory limit in bytes, pids.max) of the parent cgroup of the sandboxes of the server on `data_dir`."""
    roots = cgroup_root_for(ServeSettings(data_dir=data_dir).cgroup_name)
    v2 = "unified" in roots
    memory = (roots["unified"] / "memory.max" if v2 else roots["memory"] / "memory.limit_in_bytes").read_text()
    return int(memory), (roots["unified" if v2 else "pids"] / "pids.max").read_text().strip()


def test_the_sandboxes_parent_cgroup_has_the_ceiling_of_the_flags(quota_server: RunningServer) -> None:
    assert _ceiling(quota_server.data_dir) == (6144 << 20, "4000")


def test_the_default_ceiling_leaves_the_host_memory_and_process_ids(server: RunningServer) -> None:
    total = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) << 10
    kernel = Path("/proc/sys/kernel")
    pids = min(int((kernel / "pid_max").read_text()), int((kernel / "threads-max").read_text())) // 2
    memory, pids_max = _ceiling(server.data_dir)
    assert total - max(total // 10, 1 << 30) - 4096 < memory <= total - max(total // 10, 1 << 30)  # page-rounded
    assert pids_max == str(pids)


def test_auto_leaves_a_tenth_of_the_memory_at_least_a_gib_and_half_the_process_ids(tmp_path: Path) -> None:
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "meminfo").write_text("MemTotal:        4194304 kB\nMemFree:  1 kB\n")  # 4 GiB
    (tmp_path / "sys" / "kernel" / "pid_max").write_text("4194304\n")
    (tmp_path / "sys" / "kernel" / "threads-max").write_text("60000\n")
    assert HostCeiling().resolved(tmp_path) == ((4 << 30) - (1 << 30), 30000)
    assert HostCeiling(memory_mb=2048, pids=0).resolved(tmp_path) == (2048 << 20, None)
    assert HostCeiling(memory_mb=0, pids=100).resolved(tmp_path) == (None, 100)


@pytest.mark.parametrize(
    ("controllers", "memory_file", "unlimited"),
    [(("unified",), "unified/memory.max", "max"), (("memory", "pids"), "memory/memory.limit_in_bytes", "-1")],
    ids=["v2", "v1"],
)
def test_the_ceiling_is_written_where_each_cgroup_version_keeps_it(
    tmp_path: Path, controllers: tuple[str, ...], memory_file: str, unlimited: str
) -> None:
    roots = {name: tmp_path / name for name in controllers}
    for root in roots.values():
        root.mkdir()
    pids_file = tmp_path / controllers[-1] / "pids.max"
    write_ceiling(roots, 1 << 30, 500)
    assert ((tmp_path / memory_file).read_text(), pids_file.read_text()) == (str(1 << 30), "500")
    write_ceiling(roots, None, None)
    assert ((tmp_path / memory_file).read_text(), pids_file.read_text()) == (unlimited, "max")


def test_auto_keeps_half_the_memory_of_a_host_smaller_than_two_gib(tmp_path: Path) -> None:
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "meminfo").write_text("MemTotal:        1572864 kB\n")  # 1.5 GiB: less 1 GiB would leave a third
    (tmp_path / "sys" / "kernel" / "pid_max").write_text("32768\n")
    (tmp_path / "sys" / "kernel" / "threads-max").write_text("32768\n")
    assert HostCeiling().resolved(tmp_path) == (768 << 20, 16384)
