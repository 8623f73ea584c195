"""The real node: kube-scheduler, containerd + runc + the CNI bridge, and a kubelet built from Debian's source.

`up --real-node` runs them (and the control plane) inside the node's namespace (`_node_namespace`), with
every path of containerd and the kubelet in the state dir. The recipe, its traps and its timings are in
shared/reference/k8s-real-node.md §2; the choices that are not obvious:

- containerd's `restrict_oom_score_adj`: without CAP_SYS_RESOURCE the kubelet's -998 for the pause
  container cannot be set; `netns_mounts_under_state_dir`: pod namespaces stay in the state dir.
- the CNI bridge exists only in the namespace, with no masquerade and no route out.
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

from kube_dev._layout import ClusterLayout

__all__ = [
    "CNI_BIN_DIR", "cgroup_dirs", "containerd_argv", "import_images", "kubelet_argv", "prepare_node",
    "scheduler_argv", "sweep_node",
]  # fmt: skip

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins (upstream's is /opt/cni/bin)
_CGROUP = Path("/sys/fs/cgroup")


def _containerd_dir(layout: ClusterLayout) -> Path:
    return layout.node_dir / "containerd"


def containerd_socket(layout: ClusterLayout) -> Path:
    return _containerd_dir(layout) / "containerd.sock"


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
            "ipam": {"type": "host-local", "ranges": [[{"subnet": layout.pod_cidr}]],
                     "dataDir": str(layout.node_dir / "cni" / "ipam")},
        }],
    }  # fmt: skip


def cgroup_dirs(layout: ClusterLayout) -> list[Path]:
    """The kubelet's cgroup root in every hierarchy it needs (cgroup v1: each one but `unified`)."""
    if (_CGROUP / "cgroup.controllers").exists():  # a pure cgroup2 machine
        return [_CGROUP / layout.cgroup_name]
    return [h / layout.cgroup_name for h in sorted(_CGROUP.iterdir()) if h.is_dir() and h.name != "unified"]


def prepare_node(layout: ClusterLayout, pause_image: str) -> None:
    """Write containerd's and the CNI's configuration and make the kubelet's cgroup root."""
    c = _containerd_dir(layout)
    for d in (c / "root", c / "state", c / "runc", layout.node_dir / "cni" / "net.d", layout.node_dir / "kubelet"):
        d.mkdir(parents=True, exist_ok=True)
    (c / "config.toml").write_text(_containerd_config(layout, pause_image))
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
    kubelet = layout.node_dir / "kubelet"
    return [
        str(layout.node_bin_dir / "kubelet"), f"--kubeconfig={layout.kubeconfig('kubelet')}",
        f"--hostname-override={layout.node_name}", f"--node-ip={layout.node_ip}",
        "--container-runtime=remote", f"--container-runtime-endpoint=unix://{containerd_socket(layout)}",
        "--runtime-request-timeout=5m", f"--root-dir={kubelet}", f"--cert-dir={kubelet / 'pki'}",
        f"--volume-plugin-dir={kubelet / 'volume-plugins'}", f"--address={layout.node_ip}", "--port=10250",
        "--read-only-port=0", "--healthz-bind-address=127.0.0.1", "--healthz-port=10248",
        "--cgroup-driver=cgroupfs", f"--cgroup-root=/{layout.cgroup_name}", "--fail-swap-on=false",
        "--make-iptables-util-chains=false", "--protect-kernel-defaults=false",
        "--image-gc-high-threshold=100", "--image-gc-low-threshold=99", "--eviction-hard=memory.available<100Mi",
        "--cluster-domain=cluster.local", "--v=2",
    ]  # fmt: skip


def _ctr(layout: ClusterLayout, *args: str, timeout: float = 300) -> str:
    argv = ["ctr", "-a", str(containerd_socket(layout)), "-n", "k8s.io", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args[:2])}: {result.stderr.strip()}")
    return result.stdout


def import_images(layout: ClusterLayout, archives: list[Path]) -> None:
    """Import the OCI archives into the node's containerd (a Unix socket: reachable from outside the namespace)."""
    for archive in archives:
        _ctr(layout, "images", "import", "--no-unpack=false", str(archive))


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
    for root in cgroup_dirs(layout):
        _remove_cgroup_tree(root)


def _remove_cgroup_tree(root: Path) -> None:
    if not root.is_dir():
        return
    for _ in range(50):
        pids = [pid for d in [root, *root.rglob("*")] if d.is_dir() for pid in _procs(d)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            break
        time.sleep(0.1)
    for d in sorted((d for d in [root, *root.rglob("*")] if d.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()


def _procs(cgroup: Path) -> list[int]:
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []
