"""`python -m kube_dev up|down|status|kubelet`: the Python half of `scripts/kube-dev-cluster`."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from kube_dev._agent import run_kubelet
from kube_dev._control_plane import DAEMONS, ClusterError, check, down, load_layout, up
from kube_dev._layout import DEFAULT_BIN_DIR, DEFAULT_STATE_DIR

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
    stop = commands.add_parser("down", parents=[common], help="stop every process of the cluster")
    stop.add_argument("--purge", action="store_true", help="also delete the state dir (certificates, etcd data)")
    commands.add_parser("status", parents=[common], help="say what runs; exit 0 when all of it does, 3 when none does")
    commands.add_parser("kubelet", parents=[common], help="run the stand-in kubelet in the foreground (`up` starts it)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = _parse(argv)
    state_dir: Path = options.state_dir.resolve()
    try:
        if options.command == "up":
            overrides: dict[str, object] = {
                "apiserver_port": options.port, "etcd_port": options.etcd_port,
                "pod_network": options.pod_network if options.pod_network is not None else _pod_network(state_dir),
            }  # fmt: skip
            cache = os.environ.get("AGENT_SANDBOX_KUBE_DIR")  # where scripts/kube/build-kubernetes put them
            if options.bin_dir or cache:
                overrides["bin_dir"] = options.bin_dir or Path(cache or "") / DEFAULT_BIN_DIR.parent.name / "bin"
            print(up(load_layout(state_dir, **overrides)))
            return 0
        if options.command == "down":
            stopped = down(load_layout(state_dir), purge=options.purge)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
            return 0
        if options.command == "kubelet":
            return run_kubelet(load_layout(state_dir))
        return _status(state_dir)
    except ClusterError as exc:
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
    if healthy == len(DAEMONS):
        return 0
    return 3 if all(line == "stopped" for line in lines.values()) else 1
