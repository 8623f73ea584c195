"""The real node: kube-scheduler, containerd + runc + the CNI bridge, and a kubelet built from Debian's source.

`up --real-node` runs them (and the control plane) inside the node's namespace (`_node_namespace`), with
every path of containerd and the kubelet in the state dir. The recipe, its traps and its timings are in
shared/reference/k8s-real-node.md §2; the choices that are not obvious:

- containerd's `restrict_oom_score_adj`: without CAP_SYS_RESOURCE the kubelet's -998 for the pause
  container cannot be set; `netns_mounts_under_state_dir`: pod namespaces stay in the state dir.
- the CNI bridge exists only in the namespace, with no masquerade: pods have a default route into it, as a
  real cluster's do, and reach the node's address (the apiserver listens there for in-cluster clients) and
  each other; the namespace itself has no route out (an egress test attaches a test internet to it).
- the kubelet's cgroup root is a cgroupfs one (PID 1 need not be systemd), unique per state dir, made in
  every v1 hierarchy (a v1 cpuset starts empty: cpus and mems are copied in) or as one cgroup2 directory.
- images are never collected (`--image-gc-high-threshold=100`): the imported ones cannot be pulled again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from kube_dev._daemons import running_pid
from kube_dev._layout import ClusterLayout
from kube_dev._node_namespace import nsenter_argv

__all__ = [
    "CNI_PLUGINS", "containerd_argv", "containerd_socket", "containerd_socket_here", "import_images", "kubelet_argv",
    "prepare_node", "scheduler_argv", "sweep_node",
]  # fmt: skip

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins (upstream's is /opt/cni/bin)
CNI_PLUGINS = [CNI_BIN_DIR / name for name in ("bridge", "host-local", "loopback")]
_CGROUP = Path("/sys/fs/cgroup")


def _containerd_dir(layout: ClusterLayout) -> Path:
    return layout.node_dir / "containerd"


def containerd_socket(layout: ClusterLayout) -> Path:
    """The socket as the node sees it: in its own /run, as a state dir's path could pass the 108 bytes a Unix
    socket's may have (containerd's `.ttrpc` one beside it fails first), and named after the node, so its
    shims' command lines name this node alone."""
    return Path("/run/containerd") / f"{layout.cgroup_name}.sock"


def containerd_socket_here(layout: ClusterLayout) -> Path:
    """The same socket as this machine's mount namespace sees it (the node's /run is its `run` directory)."""
    return layout.node_dir / "run" / containerd_socket(layout).relative_to("/run")


def _containerd_config(layout: ClusterLayout, pause_image: str) -> str:
    c = _containerd_dir(layout)
    cni = layout.node_dir / "cni"
    return f"""version = 2
root = "{c / "root"}"
state = "{c / "state"}"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{containerd_socket(layout)}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "10010"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{c / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni / "net.d"}"
"""


def _cni_config(layout: ClusterLayout) -> dict[str, object]:
    return {
        "cniVersion": "0.4.0", "name": "agent-sandbox-node",
        "plugins": [{
            "type": "bridge", "bridge": "cni-node0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
            # A default route into the namespace, which goes no further (see the top).
            "ipam": {"type": "host-local", "ranges": [[{"subnet": layout.pod_cidr}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(layout.node_dir / "cni" / "ipam")},
        }],
    }  # fmt: skip


def cgroup_dirs(layout: ClusterLayout, *, every: bool = False) -> list[Path]:
    """The kubelet's cgroup root in every hierarchy it needs made (cgroup v1: each one but the cgroup2 one,
    `unified`); with `every`, in that one too (runc makes the pods' there as well)."""
    if (_CGROUP / "cgroup.controllers").exists():  # a pure cgroup2 machine
        return [_CGROUP / layout.cgroup_name]
    hierarchies = (h for h in sorted(_CGROUP.iterdir()) if h.is_dir() and (every or h.name != "unified"))
    return [h / layout.cgroup_name for h in hierarchies]


def prepare_node(layout: ClusterLayout, pause_image: str) -> None:
    """Write containerd's and the CNI's configuration and make the kubelet's cgroup root."""
    c = _containerd_dir(layout)
    for d in (c / "root", c / "state", c / "runc", layout.node_dir / "cni" / "net.d"):
        d.mkdir(parents=True, exist_ok=True)
    (c / "config.toml").write_text(_containerd_config(layout, pause_image))
    if running_pid(layout.run, "containerd") is None:  # a killed containerd's socket: `up` waits for the new one
        containerd_socket_here(layout).unlink(missing_ok=True)
    # The machine's resolver config, read here: inside, /etc/resolv.conf may point into the node's own /run.
    (layout.node_dir / "resolv.conf").write_text(Path("/etc/resolv.conf").read_text())
    (layout.node_dir / "cni" / "net.d" / "10-agent-sandbox-node.conflist").write_text(json.dumps(_cni_config(layout)))
    for d in cgroup_dirs(layout):
        d.mkdir(exist_ok=True)
        if d.parent.name == "cpuset":
            for name in ("cpuset.cpus", "cpuset.mems"):
                (d / name).write_text((d.parent / name).read_text())


def containerd_argv(layout: ClusterLayout) -> list[str]:
    return ["containerd", "--config", str(_containerd_dir(layout) / "config.toml")]


def scheduler_argv(layout: ClusterLayout) -> list[str]:
    return [
        str(layout.node_bin_dir / "kube-scheduler"), f"--kubeconfig={layout.admin_kubeconfig}",
        "--leader-elect=false", "--bind-address=127.0.0.1", "--port=0", "--secure-port=10259", "--v=1",
    ]  # fmt: skip


def kubelet_argv(layout: ClusterLayout) -> list[str]:
    # In the node's own /run (its `run` directory): the kubelet makes Unix sockets under its root dir, which a
    # state dir's path could make longer than a socket's may be.
    kubelet = Path("/run/kubelet")
    return [
        str(layout.node_bin_dir / "kubelet"), f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--hostname-override={layout.node_name}", f"--node-ip={layout.node_ip}",
        "--container-runtime=remote", f"--container-runtime-endpoint=unix://{containerd_socket(layout)}",
        "--runtime-request-timeout=5m", f"--root-dir={kubelet}", f"--cert-dir={kubelet / 'pki'}",
        f"--volume-plugin-dir={kubelet / 'volume-plugins'}", f"--address={layout.node_ip}", "--port=10250",
        "--read-only-port=0", "--healthz-bind-address=127.0.0.1", "--healthz-port=10248",
        # Pods reach the node's address: its API (exec into any pod) takes the apiserver's client certificate
        # only, and asks the apiserver what each caller may do.
        "--anonymous-auth=false", "--authorization-mode=Webhook", f"--client-ca-file={layout.pki / 'ca.crt'}",
        f"--resolv-conf={layout.node_dir / 'resolv.conf'}",
        "--cgroup-driver=cgroupfs", f"--cgroup-root=/{layout.cgroup_name}", "--fail-swap-on=false",
        "--make-iptables-util-chains=false", "--protect-kernel-defaults=false",
        "--image-gc-high-threshold=100", "--image-gc-low-threshold=99", "--eviction-hard=memory.available<100Mi",
        # The kubelet 1.20 built here sometimes publishes a deleted pod's ended containers only at its pod
        # worker's next resync (seen under load: a pod whose containers died at once went 10-60 s later, at the
        # status manager's tick after a resync): at the default 1 min that outlasted the runtime's 60 s stop
        # timeout. At 10 s that wait is about 10 s.
        "--sync-frequency=10s", "--cluster-domain=cluster.local", "--v=2",
    ]  # fmt: skip


def _ctr(layout: ClusterLayout, *args: str, timeout: float = 300) -> str:
    """ctr on the node's containerd, run inside the node (the socket's path here may be too long to dial)."""
    holder = running_pid(layout.run, "node-namespace")
    if holder is None:
        raise RuntimeError("the node's namespace is gone")
    argv = [*nsenter_argv(holder), "ctr", "-a", str(containerd_socket(layout)), "-n", "k8s.io", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args[:2])}: {result.stderr.strip()}")
    return result.stdout


def import_images(layout: ClusterLayout, archives: list[Path]) -> None:
    """Import the OCI archives into the node's containerd."""
    for archive in archives:
        _ctr(layout, "images", "import", str(archive))


def sweep_node(layout: ClusterLayout) -> None:
    """After the kubelet is gone: kill every container (through containerd, then whatever is left in the
    cgroup root, shims included) and remove the cgroup root."""
    with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
        for task in _ctr(layout, "tasks", "ls", "-q", timeout=30).split():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _ctr(layout, "tasks", "kill", "-s", "SIGKILL", task, timeout=30)
    socket = str(containerd_socket(layout))
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if socket in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    os.kill(int(proc.name), signal.SIGKILL)  # a shim of this node's containerd
    for root in cgroup_dirs(layout, every=True):
        _remove_cgroup_tree(root)


def _remove_cgroup_tree(root: Path) -> None:
    if not root.is_dir():
        return
    for _ in range(50):
        pids = [pid for d in _cgroup_tree(root) for pid in _procs(d)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            break
        time.sleep(0.1)
    for d in sorted(_cgroup_tree(root), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()


def _cgroup_tree(root: Path) -> list[Path]:
    """`root` and the cgroups below it. The kernel removes a container's cgroup while it is being listed (runc
    and containerd clean up as their processes die), which fails the walk: it is tried again."""
    for _ in range(20):
        try:
            return [root, *(d for d in root.rglob("*") if d.is_dir())]
        except FileNotFoundError:
            time.sleep(0.05)
    return [root]


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []
