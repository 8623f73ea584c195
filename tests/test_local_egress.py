"""Egress of local sandboxes, through real sandboxes into a test internet in a namespace this module creates.

Nothing leaves the machine: the only destinations are the router namespace of `tests.internet_fixtures`
(documentation ranges) and this host's own addresses, which sandboxes must not reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pool import ALL_TRAFFIC, EgressRules, EgressSettings, LocalRuntime
from tests.internet_fixtures import DNS_SERVER, OTHER_IP, WEB_IP, internet  # noqa: F401 (the fixture below)
from tests.runtime_fixtures import local_runtime, new_runtime, require_criu, runtime_settings, spec
from tests.sandbox_exec import CommandResult, run_in_sandbox

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("internet")]

TEST_DNS = EgressSettings(dns_servers=(DNS_SERVER,))
INTERNET, NO_INTERNET = EgressRules(), EgressRules(deny_out=ALL_TRAFFIC)
CURL_CANNOT_CONNECT = 7  # curl's exit code when the connection is refused (a hang would be 28, the timeout)


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    async with local_runtime(tmp_path, egress=TEST_DNS) as runtime:
        yield runtime


async def _started(rt: LocalRuntime, sandbox_id: str, rules: EgressRules = INTERNET) -> str:
    await rt.start(msgspec.structs.replace(spec(sandbox_id), egress=rules))
    return sandbox_id


async def _curl(rt: LocalRuntime, sandbox_id: str, url: str, *, user: str = "user") -> CommandResult:
    return await run_in_sandbox(rt, sandbox_id, f"curl -sSk --max-time 60 {url}", user=user)


async def _reaches(rt: LocalRuntime, sandbox_id: str, address: str) -> bool:
    result = await _curl(rt, sandbox_id, f"http://{address}/")
    if result.exit_code == 0:
        assert result.stdout == f"hello from {address}\n"
        return True
    assert result.exit_code == CURL_CANNOT_CONNECT, result
    return False


def _host_addresses() -> list[str]:
    listing = json.loads(subprocess.run(["ip", "-j", "addr"], check=True, capture_output=True).stdout)
    return [a["local"] for link in listing for a in link.get("addr_info", []) if a.get("scope") == "global"]


async def test_a_default_sandbox_fetches_by_name_and_by_address_with_curl_and_python(rt: LocalRuntime) -> None:
    box = await _started(rt, "fetcher")
    assert (await _curl(rt, box, "http://web.egress.test/")).stdout == f"hello from {WEB_IP}\n"
    assert (await _curl(rt, box, "https://web.egress.test/")).stdout == f"hello from {WEB_IP}\n"
    assert (await _curl(rt, box, f"http://{OTHER_IP}/")).stdout == f"hello from {OTHER_IP}\n"
    python = "python -c \"import urllib.request as u; print(u.urlopen('http://other.egress.test/').read().decode())\""
    assert (await run_in_sandbox(rt, box, python)).stdout == f"hello from {OTHER_IP}\n\n"


async def test_without_internet_access_nothing_is_reached_and_every_attempt_fails_at_once(rt: LocalRuntime) -> None:
    """Whether offline from the start (no route at all) or made offline (every packet refused by its table),
    connections and name lookups fail at once instead of waiting for a timeout."""
    offline = await _started(rt, "offline", NO_INTERNET)
    cut = await _started(rt, "cutoff")
    await rt.set_egress(cut, NO_INTERNET)
    connect = f"python3 -c 'import socket; socket.create_connection((\"{OTHER_IP}\", 80), timeout=600)'"
    for box in (offline, cut):
        assert not await _reaches(rt, box, WEB_IP)
        failed = await run_in_sandbox(rt, box, connect)
        assert "ConnectionRefusedError" in failed.stderr or "Network is unreachable" in failed.stderr, failed
        lookup = await run_in_sandbox(rt, box, "getent hosts web.egress.test")
        assert lookup.exit_code == 2, lookup  # not found: refused by the forwarder, or no resolver to ask
        over_tcp = await run_in_sandbox(rt, box, "getent ahosts web.egress.test; RES_OPTIONS=use-vc getent hosts x")
        assert over_tcp.stdout == "", over_tcp


async def test_the_proxys_own_address_dialled_directly_is_reset_and_the_proxy_keeps_serving(rt: LocalRuntime) -> None:
    box = await _started(rt, "direct")
    assert (await _curl(rt, box, "http://127.0.0.1:1/")).exit_code != 0
    assert await _reaches(rt, box, WEB_IP)


async def test_deny_out_blocks_its_range_only_and_allow_out_beats_deny(rt: LocalRuntime) -> None:
    denied = await _started(rt, "denyweb", EgressRules(deny_out=("203.0.113.16/28",)))
    assert not await _reaches(rt, denied, WEB_IP)
    assert await _reaches(rt, denied, OTHER_IP)
    allowed = await _started(rt, "allowother", EgressRules(allow_out=(f"{OTHER_IP}/32",), deny_out=ALL_TRAFFIC))
    assert await _reaches(rt, allowed, OTHER_IP)
    assert not await _reaches(rt, allowed, WEB_IP)


async def _fetched(rt: LocalRuntime, sandbox_id: str, curl_arguments: str) -> str | None:
    """What curl fetched, or None when the connection was refused or reset."""
    result = await _curl(rt, sandbox_id, curl_arguments)
    return result.stdout if result.exit_code == 0 else None


async def test_domain_rules_match_the_name_the_connection_sends_and_the_proxy_dials_that_name(rt: LocalRuntime) -> None:
    box = await _started(rt, "named", EgressRules(allow_out=("web.egress.test",), deny_out=ALL_TRAFFIC))
    web = f"hello from {WEB_IP}\n"
    assert await _fetched(rt, box, "http://web.egress.test/") == web  # HTTP Host
    assert await _fetched(rt, box, "https://web.egress.test/") == web  # TLS SNI
    assert await _fetched(rt, box, "http://other.egress.test/") is None
    assert await _fetched(rt, box, f"http://{WEB_IP}/") is None  # the allowed name's address, not named
    assert await _fetched(rt, box, f"--resolve other.egress.test:80:{WEB_IP} http://other.egress.test/") is None
    # Names that lie about where they go reach only what the allowed name resolves to:
    assert await _fetched(rt, box, f"--resolve web.egress.test:443:{OTHER_IP} https://web.egress.test/") == web
    assert await _fetched(rt, box, f"-H 'Host: web.egress.test' http://{OTHER_IP}/") == web


async def test_a_wildcard_domain_allows_every_name_below_it(rt: LocalRuntime) -> None:
    box = await _started(rt, "wildcard", EgressRules(allow_out=("*.egress.test",), deny_out=ALL_TRAFFIC))
    assert await _fetched(rt, box, "http://web.egress.test/") == f"hello from {WEB_IP}\n"
    assert await _fetched(rt, box, "http://other.egress.test/") == f"hello from {OTHER_IP}\n"
    assert await _fetched(rt, box, f"http://{OTHER_IP}/") is None


async def test_private_ranges_the_hosts_addresses_and_other_sandboxes_stay_unreachable(rt: LocalRuntime) -> None:
    """A host port (standing for the control plane) and another sandbox's server on 0.0.0.0 are not reachable
    under any of the host's addresses; private and link-local ranges are refused even when allowed."""
    server = await asyncio.start_server(lambda _r, w: w.close(), "0.0.0.0", 0)
    port = server.sockets[0].getsockname()[1]
    other = await _started(rt, "neighbour")
    await run_in_sandbox(rt, other, f"nohup python3 -m http.server {port} --bind 0.0.0.0 >/dev/null 2>&1 &")
    box = await _started(rt, "prober", EgressRules(allow_out=("10.0.0.0/8", "169.254.0.0/16")))
    try:
        for address in [*_host_addresses(), "10.255.255.53", "169.254.169.254", "192.168.1.1", "172.16.0.1"]:
            result = await _curl(
                rt, box, f"http://[{address}]:{port}/" if ":" in address else f"http://{address}:{port}/"
            )
            assert result.exit_code == CURL_CANNOT_CONNECT, (address, result)
    finally:
        server.close()


async def test_the_operators_denied_cidrs_hold_for_every_sandbox(tmp_path: Path) -> None:
    denying = EgressSettings(dns_servers=(DNS_SERVER,), denied=("198.51.100.0/24",))
    async with local_runtime(tmp_path, egress=denying) as rt:
        box = await _started(rt, "operator", EgressRules(allow_out=(f"{OTHER_IP}/32",)))
        assert not await _reaches(rt, box, OTHER_IP)
        assert await _reaches(rt, box, WEB_IP)


# What `nft delete table inet agent_sandbox` sends (a netfilter batch over netlink); prints the kernel's answer.
_DELETE_OWN_TABLE = (
    """
import socket, struct
msg = lambda kind, flags, seq, family, body=b"": (
    struct.pack("=IHHII", 20 + len(body), kind, flags, seq, 0) + struct.pack("!BBH", family, 0, 10) + body)
name = b"agent_sandbox\\0\\0\\0"
delete = msg(0x0A02, 0x5, 2, 1, struct.pack("=HH", 4 + 14, 1) + name)
nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)
nl.send(msg(0x10, 0x1, 1, 0) + delete + msg(0x11, 0x1, 3, 0))
print(struct.unpack_from("=i", nl.recv(4096), 16)[0])
""".replace("(\n", "(")
    .replace("\n", ";")
    .strip(";")
)


async def test_root_inside_cannot_change_the_sandboxs_network(rt: LocalRuntime) -> None:
    box = await _started(rt, "rootnet", EgressRules(deny_out=("203.0.113.16/28",)))
    for command in (
        "ip route del default", "ip route add 203.0.113.16/28 dev lo", "ip addr add 203.0.113.99/32 dev lo",
        "ip link add fake0 type veth peer name fake1", "ip link set lo down",
    ):  # fmt: skip
        result = await run_in_sandbox(rt, box, command, user="root")
        assert result.exit_code != 0, command
        assert "Operation not permitted" in result.stderr, (command, result)
    deleted = await run_in_sandbox(rt, box, f"python3 -c '{_DELETE_OWN_TABLE}'", user="root")
    assert deleted.stdout.strip() == "-1", deleted  # EPERM from nftables itself (there is no nft tool inside)
    assert not await _reaches(rt, box, WEB_IP)
    assert await _reaches(rt, box, OTHER_IP)


async def test_set_egress_replaces_the_rules_of_a_running_sandbox(rt: LocalRuntime) -> None:
    box = await _started(rt, "updated")
    assert await _reaches(rt, box, WEB_IP)
    await rt.set_egress(box, NO_INTERNET)
    assert not await _reaches(rt, box, WEB_IP)
    await rt.set_egress(box, EgressRules(allow_out=(f"{WEB_IP}/32",), deny_out=ALL_TRAFFIC))
    assert await _reaches(rt, box, WEB_IP)
    assert not await _reaches(rt, box, OTHER_IP)


@pytest.mark.parametrize("criu", [True, False], ids=["criu", "filesystem"])
async def test_rules_hold_after_freeze_thaw_snapshot_and_restore(tmp_path: Path, criu: bool) -> None:
    if criu:
        require_criu()
    async with local_runtime(tmp_path, criu=criu, egress=TEST_DNS) as rt:
        await _kept_through_snapshot(rt, "criu" if criu else "filesystem")


async def _kept_through_snapshot(rt: LocalRuntime, kind: str) -> None:
    rules = EgressRules(deny_out=("203.0.113.16/28",))
    box = await _started(rt, "kept", rules)
    await rt.freeze(box)
    await rt.thaw(box)
    assert await _reaches(rt, box, OTHER_IP)
    assert not await _reaches(rt, box, WEB_IP)
    assert (await rt.snapshot(box)).kind == kind
    await rt.restore(msgspec.structs.replace(spec(box), egress=rules))
    assert await _reaches(rt, box, OTHER_IP)
    assert not await _reaches(rt, box, WEB_IP)


async def _abandoned_server(data_dir: Path) -> list[subprocess.Popen[bytes]]:
    """A runtime that starts a sandbox and is abandoned like a killed server, on its own event loop: the sandbox
    runs on, the host's sockets in it are gone, and nothing of the runtime watches it any more. Returns the
    launcher it started, to be reaped once the sandbox is stopped."""
    first = new_runtime(runtime_settings(data_dir, criu=False, egress=TEST_DNS))
    await _started(first, "survivor", EgressRules(deny_out=("203.0.113.16/28",)))
    first.close()
    return [box.process for box in first._sandboxes.values() if box.process is not None]


async def test_rules_hold_after_a_server_restart(tmp_path: Path) -> None:
    launchers = await asyncio.to_thread(asyncio.run, _abandoned_server(tmp_path))
    async with local_runtime(tmp_path, criu=False, egress=TEST_DNS) as rt:
        assert await rt.recover() == {"survivor"}
        assert await _reaches(rt, "survivor", OTHER_IP)
        assert not await _reaches(rt, "survivor", WEB_IP)
    for launcher in launchers:
        launcher.wait(60)


def _host_network_state() -> tuple[str, ...]:
    """Links, addresses, routes (all tables) and rules of the host."""
    shows = (["link"], ["addr"], ["route", "show", "table", "all"], ["-6", "route", "show", "table", "all"], ["rule"])
    return tuple(subprocess.run(["ip", "-o", *s], check=True, capture_output=True, text=True).stdout for s in shows)


def _sockets() -> int:
    """This process's open sockets (the proxy's and DNS forwarder's are among them while a sandbox runs)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile (by another thread)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


async def test_fifty_sandboxes_started_and_stopped_leave_nothing_behind(rt: LocalRuntime) -> None:
    await rt.stop(await _started(rt, "warmup"))  # the runtime's own one-time state (threads, library) is made
    before, sockets = _host_network_state(), _sockets()
    for i in range(50):
        box = await _started(rt, f"cycle{i}", INTERNET if i % 2 else NO_INTERNET)
        if i == 0:
            assert not await _reaches(rt, box, WEB_IP)
        await rt.stop(box)
    assert _host_network_state() == before
    assert _sockets() <= sockets
    assert not rt._egress._attached
