"""A network namespace made as a pod's would be, with the egress guard (`agent-sandbox-egress-guard`) in it: an
address, a default route into the test internet of `tests.internet_fixtures`, and nothing else.

Used by tests/test_kube_egress_guard.py and loadtests/bench_guard.py. The guard runs as root with the two
capabilities its container adds and no other, as in a sandbox pod.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pool import EgressRules
from pool._kube._guard_client import put_rules
from pool._kube._guard_wire import GUARD_PORT
from pool._local._syscalls import CLONE_NEWNET, setns
from tests.internet_fixtures import DNS_SERVER, Internet
from tests.polling import wait_for
from tests.server_fixtures import REPO

__all__ = ["KEY", "POD_IP", "POD_NAME", "Pod", "made_pod"]

KEY, POD_NAME = "k" * 64, "sandbox-abc-x1y2z"
POD_IP, ROUTER_IP = "192.0.2.2", "192.0.2.1"  # TEST-NET-1: public as far as the rules go, and on no wire
# Root with the two capabilities its container adds (pool/_kube/_manifest.py) and no other.
_AS_IN_ITS_CONTAINER = ["setpriv", "--inh-caps=-all", "--bounding-set=-all,+net_admin,+net_bind_service"]


@dataclass
class Pod:
    name: str
    router: str  # the namespace the gateway's requests come from (outside the pod, as a gateway's do)
    state: Path
    guard: subprocess.Popen[bytes] | None = None

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip

    def curl(self, url: str) -> subprocess.CompletedProcess[str]:
        return self.run("curl", "-sSk", "--max-time", "20", url)

    def close(self) -> None:
        """What the pod's init container does: no-internet in force before anything else starts."""
        argv = [sys.executable, "-m", "pool._kube._guard", "--close"]
        subprocess.run(["ip", "netns", "exec", self.name, *_AS_IN_ITS_CONTAINER, *argv], cwd=REPO, check=True)

    def start_guard(self) -> None:
        env = {**os.environ, "AGENT_SANDBOX_GUARD_KEY": KEY, "AGENT_SANDBOX_POD_NAME": POD_NAME}
        argv = [sys.executable, "-m", "pool._kube._guard", f"--state-dir={self.state}", f"--dns={DNS_SERVER}"]
        self.guard = subprocess.Popen(
            ["ip", "netns", "exec", self.name, *_AS_IN_ITS_CONTAINER, *argv], env=env, cwd=REPO
        )
        wait_for(self._listening, what="the egress guard listening")

    def stop_guard(self) -> None:
        if self.guard is not None:
            self.guard.terminate()
            assert self.guard.wait(30) == 0  # SIGTERM is a clean exit, as a pod's deletion needs
            self.guard = None

    def socket(self, *, inside: bool = False) -> socket.socket:
        """A TCP socket in the router's namespace, as the gateway's are (or, `inside`, in the pod's)."""
        where = self.name if inside else self.router
        fd, own = os.open(f"/run/netns/{where}", os.O_RDONLY), os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            setns(fd, CLONE_NEWNET)
            try:
                sock = socket.socket()
            finally:
                setns(own, CLONE_NEWNET)
        finally:
            os.close(fd)
            os.close(own)
        sock.setblocking(False)
        return sock

    async def put(self, rules: EgressRules, key: str = KEY, pod: str = POD_NAME) -> None:
        sock = self.socket()
        await asyncio.get_running_loop().sock_connect(sock, (POD_IP, GUARD_PORT))
        await put_rules(sock, key, pod, rules, within=10)

    def _listening(self) -> bool:
        assert self.guard is not None
        assert self.guard.poll() is None, "the guard exited"
        with self.socket() as sock:
            sock.settimeout(2)
            return sock.connect_ex((POD_IP, GUARD_PORT)) == 0


@contextmanager
def made_pod(net: Internet, work: Path) -> Iterator[Pod]:
    name, link = f"asbpod{os.getpid()}", f"asbp{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    pod = Pod(name, net.name, work)
    try:
        for argv in (
            ["link", "add", link, "netns", net.name, "type", "veth", "peer", "name", "eth0", "netns", name],
            ["-n", net.name, "addr", "add", f"{ROUTER_IP}/24", "dev", link],
            ["-n", net.name, "link", "set", link, "up"],
            ["-n", name, "addr", "add", f"{POD_IP}/24", "dev", "eth0"], ["-n", name, "link", "set", "eth0", "up"],
            ["-n", name, "link", "set", "lo", "up"], ["-n", name, "route", "add", "default", "via", ROUTER_IP],
        ):  # fmt: skip
            subprocess.run(["ip", *argv], check=True, capture_output=True)
        yield pod
    finally:
        try:
            pod.stop_guard()
        finally:
            # The pair goes with its router end at once; a deleted namespace frees its end only once the kernel
            # gets to it, and until then the next pod's link of the same name, address and route would clash.
            subprocess.run(["ip", "-n", net.name, "link", "del", link], capture_output=True)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
