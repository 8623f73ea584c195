"""`python -m kube_dev up|down|status|images|bridge`: the Python half of `scripts/kube-dev-cluster`."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from kube_dev._agent import run_kubelet
from kube_dev._bridge import parse_forward, serve_bridge
from kube_dev._control_plane import ClusterError, check, daemons, down, load_layout, up
from kube_dev._daemons import running_pid
from kube_dev._images import ImageError, build_images
from kube_dev._layout import DEFAULT_BIN_DIR, DEFAULT_NODE_BIN_DIR, DEFAULT_STATE_DIR, built_bin_dir
from kube_dev._node_namespace import hold_namespace

__all__ = ["main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir", type=Path, default=Path(os.environ.get("AGENT_SANDBOX_KUBE_STATE", DEFAULT_STATE_DIR)),
        help="certificates, etcd data, logs, pods (default: $AGENT_SANDBOX_KUBE_STATE or %(default)s)",
    )  # fmt: skip
    parser = argparse.ArgumentParser(prog="kube-dev-cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser(
        "up", parents=[common], help="start the cluster (or what of it is not running); print the kubeconfig"
    )
    start.add_argument("--port", type=int, default=16443, help="apiserver port on 127.0.0.1 (default %(default)s)")
    start.add_argument("--etcd-port", type=int, default=12379, help="etcd client port; +1 for peers")
    start.add_argument(
        "--bin-dir",
        type=Path,
        help="where kube-apiserver and kube-controller-manager are (default: built under $AGENT_SANDBOX_KUBE_DIR)",
    )
    start.add_argument(
        "--pod-network", type=int, help="pods get 127.<N>.x.y (default: 0 for the default state dir, else 1-254)"
    )
    start.add_argument(
        "--real-node", action="store_true",
        help="a real kubelet + containerd running the images of deploy/Dockerfile.* (built with buildah when "
        "out of date), with the whole cluster in a network and mount namespace of its own; its apiserver and "
        "etcd ports are bridged to this machine's loopback",
    )  # fmt: skip
    stop = commands.add_parser("down", parents=[common], help="stop every process of the cluster")
    stop.add_argument("--purge", action="store_true", help="also delete the state dir (certificates, etcd data)")
    commands.add_parser("status", parents=[common], help="say what runs; exit 0 when all of it does, 3 when none does")
    commands.add_parser("kubelet", parents=[common], help="run the stand-in kubelet in the foreground (`up` starts it)")
    commands.add_parser("images", help="build the real node's images with buildah (cached by content hash)")
    bridge = commands.add_parser(
        "bridge", parents=[common], help="forward 127.0.0.1:PORT here into a real node's namespace"
    )
    bridge.add_argument(
        "--port", type=parse_forward, action="append", required=True, metavar="PORT[:HOST:PORT]",
        help="a port to forward, to the same port there or to HOST:PORT there (repeatable)",
    )  # fmt: skip
    bridge.add_argument("--ready-file", type=Path, help="written once every port listens")
    commands.add_parser("node-namespace", parents=[common], help="hold a real node's namespace (`up` starts it)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = _parse(argv)
    state_dir: Path = getattr(options, "state_dir", DEFAULT_STATE_DIR).resolve()
    try:
        if options.command == "up":
            overrides: dict[str, object] = {
                "apiserver_port": options.port, "etcd_port": options.etcd_port,
                "pod_network": options.pod_network if options.pod_network is not None else _pod_network(state_dir),
            }  # fmt: skip
            overrides["bin_dir"] = options.bin_dir or built_bin_dir(DEFAULT_BIN_DIR)
            if options.real_node:
                overrides |= {"real_node": True, "node_bin_dir": built_bin_dir(DEFAULT_NODE_BIN_DIR)}
            print(up(load_layout(state_dir, **overrides)))
            return 0
        if options.command == "images":
            for archive in build_images(built_bin_dir(DEFAULT_NODE_BIN_DIR) / "pause"):
                print(archive)
            return 0
        if options.command == "bridge":
            holder = running_pid(state_dir / "run", "node-namespace")
            if holder is None:
                raise ClusterError(f"no real node runs with state dir {state_dir}")
            return serve_bridge(holder, options.port, options.ready_file)
        if options.command == "node-namespace":
            return hold_namespace(load_layout(state_dir))
        if options.command == "down":
            stopped = down(load_layout(state_dir), purge=options.purge)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
            return 0
        if options.command == "kubelet":
            return run_kubelet(load_layout(state_dir))
        return _status(state_dir)
    except (ClusterError, ImageError) as exc:
        print(f"kube-dev-cluster: {exc}", file=sys.stderr)
        return 1


def _pod_network(state_dir: Path) -> int:
    if state_dir == DEFAULT_STATE_DIR:
        return 0
    return int.from_bytes(hashlib.sha256(str(state_dir).encode()).digest()[:2], "big") % 254 + 1


def _status(state_dir: Path) -> int:
    layout = load_layout(state_dir)
    lines = check(layout)
    for name, line in lines.items():
        print(f"{name:<24} {line}")
    print(f"{'kubeconfig':<24} {layout.admin_kubeconfig}")
    healthy = sum(1 for line in lines.values() if line.startswith("running") and "NOT" not in line)
    if healthy == len(daemons(layout)):
        return 0
    return 3 if all(line == "stopped" for line in lines.values()) else 1
