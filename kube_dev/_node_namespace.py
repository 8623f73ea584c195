"""The real node's own network and mount namespace, held by one process (`python -m kube_dev node-namespace`).

Everything of a real-node cluster (etcd, the apiserver, the scheduler, containerd, the kubelet, the pods)
runs in it, so nothing on the machine is touched: its loopback is private (only the bridged apiserver and
etcd ports are taken here, `_bridge`), the node's address is a veth pair whose both ends stay inside (the
kubelet refuses a loopback node IP, and this kernel may have no `dummy` driver), and the paths the kubelet
and containerd hard-code (`/var/log/pods`, `/run/containerd`, `/var/lib/cni`) are bind mounts of the state dir's own
directories.

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

__all__ = ["KUBELET_SYSCTLS", "PRIVATE_MOUNTS", "enter_net", "hold_namespace", "nsenter_argv"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

# The kubelet's setupKernelTunables (pkg/kubelet/cm/container_manager_linux.go), with the values it wants.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000",
}  # fmt: skip


# The paths containerd and the kubelet hard-code, each a directory of the node's own (under `node_dir`) inside.
PRIVATE_MOUNTS = {"var-log": "/var/log", "run": "/run", "var-lib-cni": "/var/lib/cni"}


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def enter_net(fd: int) -> None:
    """Move the calling thread into the network namespace open at `fd` (sockets made after are in it)."""
    _check(_libc.setns(fd, _CLONE_NEWNET), "setns")


def nsenter_argv(holder: int, *, mount: bool = True) -> list[str]:
    """The prefix that runs a command inside the holder's namespaces (nsenter execs: the pid stays the command's);
    without `mount`, in its network namespace alone (a gateway: it needs the pods' addresses, not the paths)."""
    return ["nsenter", "-t", str(holder), "-n", *(["-m"] if mount else []), "--"]


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
    # libcni's cache (/var/lib/cni, fixed in containerd 1.6) is kept too: a container killed without a CNI DEL
    # leaves its result there. The empty mount point is the one thing left on the machine.
    Path("/var/lib/cni").mkdir(parents=True, exist_ok=True)
    for name, target in PRIVATE_MOUNTS.items():
        directory = node / name
        directory.mkdir(parents=True, exist_ok=True)
        _bind(directory, target)
    Path("/run/lock").mkdir(exist_ok=True)
    (layout.run / "node-namespace.ready").write_text(f"{os.getpid()}\n")
    while True:  # SIGTERM's default action ends it
        signal.pause()
