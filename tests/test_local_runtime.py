"""The local runtime against real bubblewrap sandboxes: isolation, limits, pause, and clean teardown."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from pool import ALL_TRAFFIC, EgressRules, LocalRuntime, PortClosed, Resources, RuntimeFailure
from pool._local._launcher import ROOT_MOUNTPOINT
from tests.polling import wait_for_async
from tests.runtime_fixtures import TEMPLATES, http_get, local_runtime, runtime_cgroup, spec
from tests.sandbox_exec import run_in_sandbox

pytestmark = pytest.mark.anyio

Scenario = Callable[[LocalRuntime], Awaitable[None]]


async def _run(tmp_path: Path, scenario: Scenario) -> None:
    async with local_runtime(tmp_path) as runtime:
        await scenario(runtime)


async def test_sandbox_sees_only_its_own_processes(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("isolatedpids"))
        result = await run_in_sandbox(
            rt, "isolatedpids", "ls /proc | grep -E '^[0-9]+$' | sort -n | head -1; ps -e | wc -l"
        )
        first_pid, count = result.stdout.split()
        assert first_pid == "1"
        assert int(count) < 10  # executor, bash, ps, wc and the header line; the host has hundreds

    await _run(tmp_path, scenario)


async def test_network_is_loopback_only_without_egress(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(msgspec.structs.replace(spec("loopbackonly"), egress=EgressRules(deny_out=ALL_TRAFFIC)))
        interfaces = await run_in_sandbox(rt, "loopbackonly", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert interfaces.stdout.split() == ["lo"]
        outside = await run_in_sandbox(
            rt, "loopbackonly", "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=60)'"
        )
        assert outside.exit_code != 0
        assert "Network is unreachable" in outside.stderr

    await _run(tmp_path, scenario)


async def test_users_inside_are_user_and_root_but_unprivileged_on_the_host(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("whoami"))
        as_user = await run_in_sandbox(rt, "whoami", "id -un; echo $HOME; id -u")
        assert as_user.stdout.split() == ["user", "/home/user", "1000"]
        as_root = await run_in_sandbox(rt, "whoami", "id -u", user="root")
        assert as_root.stdout.strip() == "0"
        status = Path(f"/proc/{rt.host_pid('whoami')}/status").read_text()
        host_uid = int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
        assert host_uid >= 100000
        assert re.search(r"^NoNewPrivs:\s+1", status, re.M)
        sysctl = await run_in_sandbox(rt, "whoami", "echo 5 > /proc/sys/kernel/printk_ratelimit", user="root")
        assert sysctl.exit_code != 0

    await _run(tmp_path, scenario)


async def test_writes_land_in_the_writable_layer_and_system_files_are_copy_on_write(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("cowlayer"))
        home = await run_in_sandbox(rt, "cowlayer", "echo hi > ~/note && echo tmp > /tmp/t && cat ~/note /tmp/t")
        assert home.stdout.split() == ["hi", "tmp"]
        denied = await run_in_sandbox(rt, "cowlayer", "echo x > /usr/bin/evil")
        assert denied.exit_code != 0
        assert "Permission denied" in denied.stderr
        as_root = await run_in_sandbox(
            rt, "cowlayer", "echo changed >> /etc/hostname && cat /etc/hostname", user="root"
        )
        assert as_root.stdout.split() == ["sandbox", "changed"]
        upper = tmp_path / "sandboxes" / "cowlayer" / "upper"
        assert (upper / "home/user/note").read_text() == "hi\n"
        assert (upper / "etc/hostname").read_text() == "sandbox\nchanged\n"
        lower_hostnames = [d / "etc/hostname" for d in rt.images.layer_dirs(TEMPLATES["base"])]
        assert all(p.read_text() == "sandbox\n" for p in lower_hostnames if p.exists())

    await _run(tmp_path, scenario)


async def test_seccomp_blocks_namespaces_mounts_and_ptrace(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("seccomped"))
        for command in (
            "unshare -U true",
            "unshare -m true",
            "mount -t tmpfs none /mnt",
            "python3 -c 'import ctypes,sys; sys.exit(ctypes.CDLL(None).ptrace(0, 0, 0, 0) != 0)'",
        ):
            result = await run_in_sandbox(rt, "seccomped", command, user="root")
            assert result.exit_code != 0, command

    await _run(tmp_path, scenario)


async def test_memory_limit_kills_the_hog_and_the_sandbox_lives_on(tmp_path: Path) -> None:
    small = msgspec.structs.replace(TEMPLATES["base"], resources=Resources(memory_mb=96))

    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("memhog", small))
        hog = await run_in_sandbox(rt, "memhog", "python3 -c 'x = bytearray(400 * 1024 * 1024); print(len(x))'")
        assert hog.exit_code != 0
        assert "419430400" not in hog.stdout
        after = await run_in_sandbox(rt, "memhog", "echo still-here")
        assert after.stdout.strip() == "still-here"

    await _run(tmp_path, scenario)


_FORK_UNTIL_REFUSED = """
import errno, os, time
count = 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError as exc:
        print(count, errno.errorcode[exc.errno])
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    count += 1
"""


async def test_fork_bomb_stops_at_the_pids_limit(tmp_path: Path) -> None:
    small = msgspec.structs.replace(TEMPLATES["base"], resources=Resources(pids=48))

    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("forkbomb", small))
        bomb = await run_in_sandbox(rt, "forkbomb", f"python3 -c '{_FORK_UNTIL_REFUSED}'")
        forked, refused = bomb.stdout.split()
        assert int(forked) < 48
        assert refused == "EAGAIN"

    await _run(tmp_path, scenario)


async def test_server_bound_to_loopback_inside_is_reachable_and_closed_ports_are_reported(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("webserver"))
        with pytest.raises(PortClosed):
            await rt.open_socket("webserver", 8008)
        await run_in_sandbox(
            rt, "webserver", "cd /tmp && echo hello > index.html && (python3 -m http.server 8008 --bind 127.0.0.1 "
            ">/dev/null 2>&1 &) && for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/8008) 2>/dev/null && break; "
            "sleep 0.1; done",
        )  # fmt: skip
        reader, writer = await asyncio.open_connection(sock=await rt.open_socket("webserver", 8008))
        writer.write(b"GET /index.html HTTP/1.0\r\n\r\n")
        response = await reader.read()
        writer.close()
        assert response.startswith(b"HTTP/1.0 200")
        assert response.endswith(b"hello\n")

    await _run(tmp_path, scenario)


async def test_template_start_commands_run_in_the_background_and_start_waits_for_the_ports(tmp_path: Path) -> None:
    web = msgspec.structs.replace(
        TEMPLATES["base"],
        start=(
            "sleep 0.3 && id -un > ~/who && exec python3 -m http.server 8008 --bind 127.0.0.1 --directory ~",
            "sleep 600",  # never ends: start does not wait for the commands, only for the ports
        ),
        ports=(8008,),
    )

    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("startcmds", web))
        assert await http_get(rt, "startcmds", 8008, "/who") == b"user\n"  # as the template's user
        running = await run_in_sandbox(rt, "startcmds", "pgrep -u user -x sleep")
        assert running.exit_code == 0

    await _run(tmp_path, scenario)


async def test_start_fails_clearly_when_a_template_port_never_opens(tmp_path: Path) -> None:
    closed = msgspec.structs.replace(TEMPLATES["base"], ports=(8009,))

    async with local_runtime(tmp_path, ports_timeout=0.3) as rt:
        with pytest.raises(RuntimeFailure, match=r"port 8009 within 0\.3 s"):
            await rt.start(spec("noport", closed))
        assert not rt.is_running("noport")
        assert not (tmp_path / "sandboxes" / "noport").exists()


async def test_frozen_sandbox_thaws_and_answers(tmp_path: Path) -> None:
    async def scenario(rt: LocalRuntime) -> None:
        await rt.start(spec("freezer"))
        await rt.freeze("freezer")
        assert rt.is_frozen("freezer")
        await rt.thaw("freezer")
        assert not rt.is_frozen("freezer")
        assert (await run_in_sandbox(rt, "freezer", "echo awake")).stdout == "awake\n"

    await _run(tmp_path, scenario)


def _children() -> list[int]:
    """Our child processes, zombies included (other processes on the host do not count)."""
    me, found = os.getpid(), []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # not a process, or it is gone
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.append(int(entry))
    return found


def _host_footprint(tmp_path: Path) -> tuple[list[str], list[int], list[str]]:
    # The host's mounts that are this runtime's (its data directory, the sandboxes' root mount point): a count of
    # every mount would see whatever else the machine mounts meanwhile (network namespaces, other servers).
    ours = (str(tmp_path), str(ROOT_MOUNTPOINT))
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if any(p in line for p in ours)]
    processes = _children()
    leftovers = sorted(os.listdir(tmp_path / "sandboxes")) if (tmp_path / "sandboxes").exists() else []
    return mounts, processes, leftovers


async def test_nothing_leaks_after_fifty_start_stop_cycles_and_a_crash(tmp_path: Path) -> None:
    crashed: list[str] = []

    async def record_exit(sandbox_id: str, why: str) -> None:
        crashed.append(sandbox_id)

    async def scenario(rt: LocalRuntime) -> None:
        rt.set_exit_listener(record_exit)
        await rt.start(spec("warmup"))  # what a runtime starts once for all its sandboxes (the nftables worker)
        await rt.stop("warmup")
        mounts, processes, _ = _host_footprint(tmp_path)
        for i in range(50):
            await rt.start(spec(f"cycle{i}"))
            await rt.stop(f"cycle{i}")
        await rt.start(spec("crasher"))
        os.kill(rt.host_pid("crasher"), 9)
        await wait_for_async(lambda: crashed, what="the exit listener to hear of the crash")
        await asyncio.sleep(0.1)  # and of nothing else
        assert crashed == ["crasher"]
        assert rt.is_snapshotted("crasher")  # its files are kept until it is stopped
        await rt.stop("crasher")
        after_mounts, after_processes, leftovers = _host_footprint(tmp_path)
        assert leftovers == []
        assert after_mounts == mounts
        extra = set(after_processes) - set(processes)
        assert extra == set(), [Path(f"/proc/{p}/status").read_text()[:300] for p in extra]
        cgroups = [p for p in Path("/sys/fs/cgroup").glob(f"*/{runtime_cgroup(tmp_path)}/*") if p.is_dir()]
        assert cgroups == []

    await _run(tmp_path, scenario)
