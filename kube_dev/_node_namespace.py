"""The real node's own network and mount namespace, held by one process (`python -m kube_dev node-namespace`).

Everything of a real-node cluster (etcd, the apiserver, the scheduler, containerd, the kubelet, the pods)
runs in it, so nothing on the machine is touched: its loopback is private (the default ports never clash
with another cluster), the node's address is a veth pair whose both ends stay inside (the kubelet refuses a
loopback node IP, and this kernel may have no `dummy` driver), and the paths the kubelet and containerd
hard-code (`/var/log/pods`, `/run/containerd`) are bind mounts of the state dir's own directories.

The kubelet *writes* six kernel tunables at start (`setupKernelTunables`), and sysctls are not covered by
these namespaces: a write would change the whole machine (`kernel.panic_on_oops=1` would panic it on any
oops). Each is shadowed by a file holding the value the kubelet wants, bind-mounted over its /proc/sys entry
in this mount namespace alone: the kubelet reads its own value back and writes nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

from kube_dev._layout import ClusterLayout

__all__ = ["KUBELET_SYSCTLS", "enter_net", "hold_namespace", "nsenter_argv"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

# The kubelet's setupKernelTunables (pkg/kubelet/cm/container_manager_linux.go), with the values it wants.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000",
}  # fmt: skip


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def enter_net(fd: int) -> None:
    """Move the calling thread into the network namespace open at `fd` (sockets made after are in it)."""
    _check(_libc.setns(fd, _CLONE_NEWNET), "setns")


def nsenter_argv(holder: int) -> list[str]:
    """The prefix that runs a command inside the holder's namespaces (nsenter execs: the pid stays the command's)."""
    return ["nsenter", "-t", str(holder), "-n", "-m", "--"]


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")


def _bind(source: Path, target: str) -> None:
    _run("mount", "--bind", str(source), target)


def hold_namespace(layout: ClusterLayout) -> int:
    """Make the namespaces, set them up, then wait for SIGTERM (they end with the last process in them)."""
    node = layout.node_dir
    _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET), "unshare")
    _run("mount", "--make-rprivate", "/")
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "link", "add", "node0", "type", "veth", "peer", "name", "node1")
    _run("ip", "addr", "add", f"{layout.node_ip}/32", "dev", "node0")
    _run("ip", "link", "set", "node1", "up")
    _run("ip", "link", "set", "node0", "up")
    sysctls = node / "sysctl"
    for name, value in KUBELET_SYSCTLS.items():
        shadow = sysctls / name.replace("/", ".")
        shadow.parent.mkdir(parents=True, exist_ok=True)
        shadow.write_text(value + "\n")
        _bind(shadow, f"/proc/sys/{name}")
    for directory, target in ((node / "var-log", "/var/log"), (node / "run", "/run")):
        directory.mkdir(parents=True, exist_ok=True)
        _bind(directory, target)
    Path("/run/lock").mkdir(exist_ok=True)
    (layout.run / "node-namespace.ready").write_text(f"{os.getpid()}\n")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        signal.pause()
