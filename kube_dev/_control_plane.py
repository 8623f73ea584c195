"""Starting, checking and stopping the cluster's processes: etcd, apiserver, controller-manager and a kubelet
(the stand-in; or, with `real_node`, the namespace holder, its bridge, kube-scheduler, containerd and the real
kubelet, every one but the bridge inside the node's namespace: `_node_namespace`, `_real_node`).

Flags that matter, and why:
- `--authorization-mode=Node,RBAC`: RBAC is what `install.yaml`'s Role is tested against.
- the service-account issuer and key pair: TokenRequest (`serviceaccounts/token`) issues tokens, and the
  controller-manager's token controller gives each ServiceAccount its secret, which pods need in 1.20.
- `--endpoint-reconciler-type=none`: the apiserver would otherwise publish 127.0.0.1 as the `kubernetes`
  Service's endpoint. `--enable-priority-and-fairness=false`: less work, no behaviour the tests rely on.
- the controller-manager runs only controllers that make sense on this one-node cluster (no IPAM, no volume
  attach, no CSR signing; node lifecycle only for a real node) and with per-controller credentials, as in a
  real cluster.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec

from kube_dev._daemons import running_pid, start_daemon, stop_daemon
from kube_dev._images import PAUSE_IMAGE, build_images
from kube_dev._layout import ClusterLayout, decode_layout, encode_layout
from kube_dev._node_namespace import PRIVATE_MOUNTS, nsenter_argv
from kube_dev._pki import ensure_pki, read_token, write_kubeconfigs
from kube_dev._real_node import (
    CNI_PLUGINS,
    containerd_argv,
    containerd_socket_here,
    import_images,
    kubelet_argv,
    prepare_node,
    scheduler_argv,
    sweep_node,
)
from kube_dev._tracking import ProcessTracker

__all__ = ["ClusterError", "check", "daemons", "down", "load_layout", "up"]

_CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
_STAND_IN = (*_CONTROL_PLANE, "kubelet")
# The real node's: the namespace holder first, then the bridge that makes its apiserver and etcd reachable here.
_REAL_NODE = ("node-namespace", "bridge", *_CONTROL_PLANE, "kube-scheduler", "containerd", "kubelet")
_IN_NAMESPACE = {*_CONTROL_PLANE, "kube-scheduler", "containerd", "kubelet"}
_CONTROLLERS = "*,-nodeipam,-attachdetach,-persistentvolume-binder,-ttl,-bootstrapsigner," \
    "-tokencleaner,-csrsigning,-csrapproving,-csrcleaner,-cloud-node-lifecycle,-route,-service"  # fmt: skip
# The stand-in's node is always Ready; a real one is tainted until the node lifecycle controller sees it Ready.
_STAND_IN_CONTROLLERS = _CONTROLLERS + ",-nodelifecycle"
_REPO = Path(__file__).resolve().parents[1]


class ClusterError(Exception):
    """The cluster could not be started, or a component failed while starting; the message says which."""


def daemons(layout: ClusterLayout) -> tuple[str, ...]:
    """The cluster's processes, in the order they start."""
    return _REAL_NODE if layout.real_node else _STAND_IN


def load_layout(state_dir: Path, **overrides: object) -> ClusterLayout:
    """The layout a running cluster was started with (its `layout.json`), else the defaults plus `overrides`.
    Without `overrides` (status, down) the saved one even when nothing runs: a real node's containers outlive
    a crashed cluster, and `down` must know to sweep them."""
    saved = state_dir / "layout.json"
    if saved.exists() and (not overrides or any(running_pid(state_dir / "run", name) for name in _REAL_NODE)):
        return decode_layout(saved.read_bytes())
    return decode_layout(
        {"state_dir": str(state_dir), **{k: str(v) if isinstance(v, Path) else v for k, v in overrides.items()}}
    )


def _argv(layout: ClusterLayout, name: str) -> list[str]:
    if name in _IN_NAMESPACE and layout.real_node:
        holder = running_pid(layout.run, "node-namespace")
        if holder is None:
            raise ClusterError("the node's namespace is gone")
        return [*nsenter_argv(holder), *_own_argv(layout, name)]
    return _own_argv(layout, name)


def _own_argv(layout: ClusterLayout, name: str) -> list[str]:
    pki, e = layout.pki, layout.etcd_port
    state = ["--state-dir", str(layout.state_dir)]
    if name == "node-namespace":
        return [sys.executable, "-m", "kube_dev", name, *state]
    if name == "bridge":
        ports = [
            "--port",
            str(layout.apiserver_port),
            "--port",
            str(e),
            "--ready-file",
            str(layout.run / "bridge.ready"),
        ]
        return [sys.executable, "-m", "kube_dev", name, *state, *ports]
    if name == "kube-scheduler":
        return scheduler_argv(layout)
    if name == "containerd":
        return containerd_argv(layout)
    if name == "kubelet" and layout.real_node:
        return kubelet_argv(layout)
    if name == "etcd":
        return [
            str(layout.etcd), "--name", "dev", "--data-dir", str(layout.etcd_data),
            "--listen-client-urls", f"http://127.0.0.1:{e}", "--advertise-client-urls", f"http://127.0.0.1:{e}",
            "--listen-peer-urls", f"http://127.0.0.1:{e + 1}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{e + 1}", "--initial-cluster", f"dev=http://127.0.0.1:{e + 1}",
        ]  # fmt: skip
    if name == "kube-apiserver":
        return [
            # A real node's pods reach it at the node's address; the namespace has no other way in.
            str(layout.bin_dir / name), f"--bind-address={'0.0.0.0' if layout.real_node else '127.0.0.1'}",
            f"--secure-port={layout.apiserver_port}",
            "--insecure-port=0", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--etcd-servers=http://127.0.0.1:{e}", f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}", f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}", "--service-cluster-ip-range=10.0.0.0/24",
            "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
            # The real node's name resolves nowhere: exec, logs and port-forward dial its InternalIP, with a client
            # certificate (its kubelet lets no one in anonymously: sandboxes reach the node's address).
            *([
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            ] if layout.real_node else []),
        ]  # fmt: skip
    if name == "kube-controller-manager":
        return [
            str(layout.bin_dir / name), f"--kubeconfig={layout.kubeconfig('controller-manager')}",
            "--bind-address=127.0.0.1", "--secure-port=0", "--port=0", "--leader-elect=false",
            "--use-service-account-credentials=true", f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}", "--profiling=false", "--v=1",
            f"--controllers={_CONTROLLERS if layout.real_node else _STAND_IN_CONTROLLERS}",
            # The default 20 requests/s spaces the start of its ~30 controllers by 0.25 s each.
            "--kube-api-qps=500", "--kube-api-burst=1000",
        ]  # fmt: skip
    return [sys.executable, "-m", "kube_dev", "kubelet", *state]


def _env(layout: ClusterLayout, name: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    if name in ("node-namespace", "bridge") or (name == "kubelet" and not layout.real_node):
        env["PYTHONPATH"] = str(_REPO)
    return env


def _check_binaries(layout: ClusterLayout) -> None:
    binaries = [layout.etcd, layout.bin_dir / "kube-apiserver", layout.bin_dir / "kube-controller-manager"]
    for binary in binaries:
        if not os.access(binary, os.X_OK):
            raise ClusterError(f"{binary} is missing: run `scripts/kube-dev-cluster build` first")
    if layout.real_node:
        for binary in (layout.node_bin_dir / "kubelet", layout.node_bin_dir / "kube-scheduler"):
            if not os.access(binary, os.X_OK):
                raise ClusterError(f"{binary} is missing: run `scripts/kube-dev-cluster build --real-node` first")
        for command in ("containerd", "runc", "ctr", "nsenter", "ip", "buildah", "debootstrap"):
            if shutil.which(command) is None:
                raise ClusterError(f"{command} is missing: run `scripts/setup --test` (it installs the real node's)")
        for plugin in CNI_PLUGINS:
            if not plugin.exists():
                raise ClusterError(f"{plugin} is missing: install containernetworking-plugins (scripts/setup --test)")
        hidden = [path for path in PRIVATE_MOUNTS.values() if layout.state_dir.resolve().is_relative_to(path)]
        if hidden:
            raise ClusterError(f"a real node's state dir cannot be under {hidden[0]}: the node mounts its own there")


def _client(layout: ClusterLayout) -> httpx.Client:
    token = read_token(layout, "agent-sandbox-admin")
    return httpx.Client(
        base_url=layout.server, headers={"Authorization": f"Bearer {token}"}, timeout=5.0, trust_env=False,
        verify=ssl.create_default_context(cafile=layout.pki / "ca.crt"),
    )  # fmt: skip


def up(layout: ClusterLayout) -> Path:
    """Start whatever is not running, wait until the whole cluster is usable; the admin kubeconfig's path."""
    _check_binaries(layout)
    for d in (layout.state_dir, layout.run, layout.logs, layout.pods):
        d.mkdir(parents=True, exist_ok=True)
    if not any(running_pid(layout.run, name) for name in _REAL_NODE):
        (layout.state_dir / "layout.json").write_bytes(encode_layout(layout))
    started = time.monotonic()
    ensure_pki(layout)
    write_kubeconfigs(layout)
    archives = build_images(layout.node_bin_dir / "pause") if layout.real_node else []
    if layout.real_node:
        _start_namespace(layout, started)
    _start(layout, "etcd")
    _wait(layout, "etcd", lambda: _etcd_healthy(layout), 30.0, started)
    _start(layout, "kube-apiserver")
    with _client(layout) as client:
        _wait(layout, "kube-apiserver", lambda: _get(client, "/readyz") == "ok", 90.0, started)
        # Only now: a controller-manager that starts before the apiserver answers falls back to one shared
        # identity instead of a ServiceAccount per controller.
        _start(layout, "kube-controller-manager")
        if layout.real_node:
            _start_node(layout, archives, started)
        else:
            _start(layout, "kubelet")
        _wait(layout, "kube-controller-manager", lambda: _default_sa_has_token(client), 60.0, started)
        _wait(layout, "kubelet", lambda: _node_ready(client, layout.node_name), 120.0, started)
        if layout.real_node:
            untainted = f"node {layout.node_name} untainted"
            _wait(layout, "kubelet", lambda: _untainted(client, layout.node_name), 60.0, started, what=untainted)
    return layout.admin_kubeconfig


def _start_namespace(layout: ClusterLayout, started: float) -> None:
    """The namespace holder, then the bridge into it (a bridge into a namespace that is gone starts anew)."""
    if running_pid(layout.run, "node-namespace") is None:
        stop_daemon(layout.run, "bridge")
        (layout.run / "node-namespace.ready").unlink(missing_ok=True)
        _start(layout, "node-namespace")
    _wait(layout, "node-namespace", (layout.run / "node-namespace.ready").exists, 30.0, started)
    if running_pid(layout.run, "bridge") is None:
        (layout.run / "bridge.ready").unlink(missing_ok=True)
        _start(layout, "bridge")
    # Not "the port answers": another cluster's etcd could answer there.
    _wait(layout, "bridge", (layout.run / "bridge.ready").exists, 30.0, started)


def _start_node(layout: ClusterLayout, archives: list[Path], started: float) -> None:
    prepare_node(layout, PAUSE_IMAGE)
    _start(layout, "kube-scheduler")
    _start(layout, "containerd")
    _wait(layout, "containerd", containerd_socket_here(layout).exists, 30.0, started)
    try:
        import_images(layout, archives)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"the node's images could not be imported: {exc}") from exc
    print(f"kube-dev-cluster: {len(archives)} images imported after {time.monotonic() - started:.1f} s",
          file=sys.stderr)  # fmt: skip
    _start(layout, "kubelet")


def _start(layout: ClusterLayout, name: str) -> None:
    if running_pid(layout.run, name) is None:
        start_daemon(layout.run, layout.logs / f"{name}.log", name, _argv(layout, name), env=_env(layout, name),
                     cwd=layout.state_dir)  # fmt: skip


def _wait(
    layout: ClusterLayout, name: str, ready: Callable[[], bool], timeout: float, started: float, *, what: str = ""
) -> None:
    """Until `ready()`; ClusterError when the daemon `name` exits first or `timeout` passes (`what`: what is
    awaited, when it is not that daemon being ready)."""
    what = what or f"{name} ready"
    deadline = time.monotonic() + timeout
    while not ready():
        if running_pid(layout.run, name) is None:
            raise ClusterError(
                f"{name} exited while starting; the end of {layout.logs / name}.log:\n{_tail(layout, name)}"
            )
        if time.monotonic() > deadline:
            raise ClusterError(f"not {what} after {timeout:.0f} s; see {layout.logs / name}.log")
        time.sleep(0.05)
    print(f"kube-dev-cluster: {what} after {time.monotonic() - started:.1f} s", file=sys.stderr)


def _tail(layout: ClusterLayout, name: str) -> str:
    try:
        return "\n".join((layout.logs / f"{name}.log").read_text(errors="replace").splitlines()[-15:])
    except OSError:
        return "(no log)"


def _get(client: httpx.Client, path: str) -> str | None:
    try:
        response = client.get(path)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _etcd_healthy(layout: ClusterLayout) -> bool:
    try:
        response = httpx.get(f"http://127.0.0.1:{layout.etcd_port}/health", timeout=2.0, trust_env=False)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and b'"true"' in response.content


def _default_sa_has_token(client: httpx.Client) -> bool:
    """The service-account and token controllers have run: pods can be admitted in new namespaces."""
    body = _get(client, "/api/v1/namespaces/default/serviceaccounts/default")
    return body is not None and bool(msgspec.json.decode(body).get("secrets"))


def _node_ready(client: httpx.Client, name: str) -> bool:
    body = _get(client, f"/api/v1/nodes/{name}")
    if body is None:
        return False
    conditions = msgspec.json.decode(body).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _untainted(client: httpx.Client, name: str) -> bool:
    """No `not-ready` taint left: pods are scheduled to the node."""
    body = _get(client, f"/api/v1/nodes/{name}")
    if body is None:
        return False
    taints = msgspec.json.decode(body).get("spec", {}).get("taints") or []
    return not any(t.get("key") == "node.kubernetes.io/not-ready" for t in taints)


def check(layout: ClusterLayout) -> dict[str, str]:
    """Component → one line of status; every line starts with "running" when that component is healthy."""
    lines = {}
    for name in daemons(layout):
        pid = running_pid(layout.run, name)
        lines[name] = f"running (pid {pid})" if pid else "stopped"
    if running_pid(layout.run, "kube-apiserver") and (layout.pki / "tokens.csv").exists():
        with _client(layout) as client:
            ready = _get(client, "/readyz") == "ok"
            lines["kube-apiserver"] += f", {layout.server} {'ready' if ready else 'NOT ready'}"
            if running_pid(layout.run, "kubelet"):
                node = "Ready" if ready and _node_ready(client, layout.node_name) else "NOT Ready"
                lines["kubelet"] += f", node {layout.node_name} {node}"
    return lines


def down(layout: ClusterLayout, *, purge: bool = False) -> list[str]:
    """Stop every component (the kubelet first, so it ends its pods); the names of those that were running."""
    if not layout.real_node:
        stopped = [name for name in reversed(_STAND_IN) if stop_daemon(layout.run, name, grace=40.0)]
        ProcessTracker(layout.cgroup_name).sweep()  # pods of a kubelet that died without cleaning up
    else:
        # The kubelet leaves its containers running when it stops: containerd kills them, then the rest goes.
        stopped = ["kubelet"] if stop_daemon(layout.run, "kubelet", grace=20.0) else []
        try:
            sweep_node(layout)
        finally:  # whatever the sweep met, the daemons go: a cluster left running outlives its state dir
            stopped += [name for name in reversed(_REAL_NODE[:-1]) if stop_daemon(layout.run, name, grace=20.0)]
    if purge and layout.state_dir.exists():
        shutil.rmtree(layout.state_dir)
    return stopped
