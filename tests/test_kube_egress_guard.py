"""The egress guard (`agent-sandbox-egress-guard`) in a network namespace made as a pod's would be
(`tests.egress_guard_fixtures`). The real node's tests run it in real pods; these pin its behaviour where each
case takes a few milliseconds.

Nothing leaves the machine: the "pod" reaches only the router namespace of `tests.internet_fixtures`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pool import ALL_TRAFFIC, EgressRules
from pool._kube._guard_wire import GUARD_MARK, GUARD_PORT, GuardRefused, encode_rules
from tests.egress_guard_fixtures import KEY, POD_IP, POD_NAME, Pod, made_pod
from tests.internet_fixtures import OTHER_IP, WEB_IP, Internet, internet  # noqa: F401 (the fixture)
from tests.server_fixtures import REPO

CURL_CANNOT_CONNECT, CURL_RESET = 7, 56

pytestmark = [pytest.mark.anyio, pytest.mark.sandbox]


@pytest.fixture
def pod(internet: Internet, tmp_path: Path) -> Iterator[Pod]:  # noqa: F811 (the imported fixture)
    with made_pod(internet, tmp_path) as made:
        made.close()  # as its init container does
        made.start_guard()
        yield made


def _reached(result: subprocess.CompletedProcess[str], address: str) -> bool:
    if result.returncode == 0:
        assert result.stdout == f"hello from {address}\n"
        return True
    assert result.returncode in (CURL_CANNOT_CONNECT, CURL_RESET), result
    return False


async def test_a_pod_reaches_nothing_until_the_gateway_sends_its_rules(pod: Pod) -> None:
    assert pod.curl(f"http://{WEB_IP}/").returncode == CURL_CANNOT_CONNECT  # refused at connect, not a hang
    assert pod.run("getent", "hosts", "web.egress.test").returncode != 0  # no name answered either
    await pod.put(EgressRules())
    assert _reached(pod.curl(f"http://{WEB_IP}/"), WEB_IP)
    assert _reached(pod.curl("http://web.egress.test/"), WEB_IP)  # names resolve through the guard's forwarder
    assert pod.curl("https://web.egress.test/").stdout == f"hello from {WEB_IP}\n"


async def test_the_rules_hold_as_e2b_states_them_and_are_replaced_in_place(pod: Pod) -> None:
    await pod.put(EgressRules(deny_out=(WEB_IP,)))
    assert not _reached(pod.curl(f"http://{WEB_IP}/"), WEB_IP)
    assert _reached(pod.curl(f"http://{OTHER_IP}/"), OTHER_IP)
    await pod.put(EgressRules(deny_out=ALL_TRAFFIC))
    assert not _reached(pod.curl(f"http://{OTHER_IP}/"), OTHER_IP)
    await pod.put(EgressRules(allow_out=(f"{OTHER_IP}/32",), deny_out=("0.0.0.0/0",)))
    assert _reached(pod.curl(f"http://{OTHER_IP}/"), OTHER_IP)
    assert not _reached(pod.curl(f"http://{WEB_IP}/"), WEB_IP)


async def test_domain_rules_match_the_name_the_connection_sends(pod: Pod) -> None:
    await pod.put(EgressRules(allow_out=("web.egress.test",), deny_out=("0.0.0.0/0",)))
    assert _reached(pod.curl("http://web.egress.test/"), WEB_IP)  # Host
    assert pod.curl("https://web.egress.test/").returncode == 0  # TLS SNI
    assert not _reached(pod.curl("http://other.egress.test/"), OTHER_IP)
    # The allowed name on a connection to another address: dialled as the name says, never where it pointed.
    spoofed = pod.run("curl", "-sS", "--max-time", "20", "-H", "Host: web.egress.test", f"http://{OTHER_IP}/")
    assert spoofed.stdout in ("", f"hello from {WEB_IP}\n"), spoofed


async def test_private_and_the_pods_own_addresses_stay_closed_whatever_the_rules(pod: Pod) -> None:
    await pod.put(EgressRules(allow_out=("10.0.0.0/8", POD_IP, "169.254.169.254")))
    for address in ("10.1.2.3", "169.254.169.254", POD_IP):
        result = pod.run("curl", "-sS", "--max-time", "20", f"http://{address}:{GUARD_PORT}/")
        assert result.returncode in (CURL_CANNOT_CONNECT, CURL_RESET), (address, result)


async def test_only_the_namespaces_key_for_this_pod_and_a_fresh_nonce_change_the_rules(pod: Pod) -> None:
    with pytest.raises(GuardRefused, match="not signed"):
        await pod.put(EgressRules(), key="not" + KEY[3:])
    with pytest.raises(GuardRefused, match="not signed"):
        await pod.put(EgressRules(), pod="another-pod-that-had-this-address")
    assert pod.curl(f"http://{WEB_IP}/").returncode == CURL_CANNOT_CONNECT  # still closed
    # A request signed for one connection's nonce, replayed on the next: refused (captured bytes are worthless).
    body = encode_rules(EgressRules())
    replay = ["ip", "netns", "exec", pod.router, "python3", "-c", _REPLAY, POD_IP, str(GUARD_PORT), KEY, POD_NAME]
    answers = subprocess.run([*replay, body.decode()], capture_output=True, text=True, timeout=30).stdout.split("\n")
    assert answers[0].startswith("ok "), answers
    assert answers[1].startswith("error: not signed"), answers
    assert pod.curl(f"http://{WEB_IP}/").returncode == 0


async def test_the_sandbox_cannot_even_talk_to_its_guard(pod: Pod) -> None:
    """Over loopback (the only way the pod's own processes reach the port) the guard closes at once."""
    talk = f"import socket; s = socket.create_connection(('127.0.0.1', {GUARD_PORT})); print(repr(s.recv(64)))"
    assert pod.run("python3", "-c", talk).stdout.strip() == "b''"


async def test_a_restarted_guard_puts_the_last_rules_back(pod: Pod) -> None:
    await pod.put(EgressRules(deny_out=(WEB_IP,)))
    pod.stop_guard()
    assert not _reached(pod.curl(f"http://{WEB_IP}/"), WEB_IP)  # no guard: the table stays, nothing gets out
    assert not _reached(pod.curl(f"http://{OTHER_IP}/"), OTHER_IP)
    pod.start_guard()
    assert _reached(pod.curl(f"http://{OTHER_IP}/"), OTHER_IP)
    assert not _reached(pod.curl(f"http://{WEB_IP}/"), WEB_IP)


async def test_without_net_admin_and_net_raw_a_process_cannot_pass_as_the_guard(pod: Pod) -> None:
    """What a sandbox's root has in its container (the runtime drops NET_RAW, and never gives NET_ADMIN)."""
    await pod.put(EgressRules(deny_out=ALL_TRAFFIC))
    marked = f"import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, {GUARD_MARK})"
    dropped = pod.run("setpriv", "--bounding-set=-net_admin,-net_raw", "--inh-caps=-net_admin,-net_raw",
                      "python3", "-c", marked)  # fmt: skip
    assert dropped.returncode != 0
    assert "Operation not permitted" in dropped.stderr, dropped
    nft = f"import sys; sys.path.insert(0, {str(REPO)!r}); from pool._local._nft_worker import apply_here; " \
          "apply_here('delete table inet agent_sandbox')"  # fmt: skip
    refused = pod.run("setpriv", "--bounding-set=-net_admin,-net_raw", "--inh-caps=-net_admin,-net_raw",
                      "python3", "-c", nft)  # fmt: skip
    assert refused.returncode != 0, refused
    assert not _reached(pod.curl(f"http://{WEB_IP}/"), WEB_IP)


# The protocol written out again (not `_guard_wire`'s): the first exchange answering `ok` checks the two agree.
_REPLAY = r"""
import hashlib, hmac, os, socket, sys
address, port, key, pod, body = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].encode(), sys.argv[5].encode()
def exchange(line=None):
    with socket.create_connection((address, port)) as s:
        f = s.makefile("rwb")
        theirs, ours = f.readline().rstrip(b"\n"), os.urandom(16).hex().encode()
        mac = hmac.new(key.encode(), b"\n".join((b"rules", theirs, ours, pod, body)), hashlib.sha256).hexdigest()
        line = line or b" ".join((ours, mac.encode(), body))
        f.write(line + b"\n"); f.flush()
        print(f.readline().decode().strip())
        return line
exchange(exchange())
"""
