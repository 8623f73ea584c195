"""Benchmark: warm-pool claims and resumes from zero on Kubernetes (the dev cluster), through `agent-sandbox serve`.

Starts its own dev cluster (`scripts/kube-dev-cluster up` on free ports in a temporary state dir, `down` at the
end), a namespace in it, and `agent-sandbox serve --runtime kubernetes --warm base=W` on that namespace (idle
pauses off: only E2B's pause scales a sandbox to zero). Then, in rounds, through the E2B REST API and the
gateway's data plane, in raw HTTP (nothing retried or pooled):

    cold-create          POST /v2/sandboxes -> 201 for a template with no warm pool (the baseline): on the stand-in
                         `sandbox-base-node` (its kubelet runs every template's executor alike), on the real node
                         `base-cold`, `base`'s image under another name; `+cmd`: then `echo hi` through envd's
                         Process/Start
    warm-claim           the same for `base`, its pool full: the create claims a warm pod
    running-get          first byte of GET envd /health (port ENVD_PORT, Host `<ENVD_PORT>-<id>.sandbox.localhost`) on a
                         running sandbox (the baseline of the resumes)
    pause                POST /sandboxes/{id}/pause until the sandbox is paused: its files archived, scaled to zero
    resume-held-get      the same GET on a sandbox E2B's pause scaled to zero (`autoResume`: the request wakes it):
                         the first byte after a wake
    resume-connect       POST /sandboxes/{id}/connect -> 201 on such a sandbox; `+get`: then that GET's first byte

With `--real-node` it measures the stand-in's cluster and then a real node's (`up --real-node`: a real kubelet +
containerd running the images of deploy/Dockerfile.*, sandboxes as `user`, the gateway in the node's namespace)
in the same run, and prints both with the real node's p50 over the stand-in's. With `--guard` as well, it then
measures the real node again with the egress guard in every sandbox pod (`--kube-egress-guard-image`), and
prints that against the real node without it.

Every timed step starts with the pool full, no refill starting, and no sandbox pod but the one it measures, so
each figure is one operation on an otherwise idle cluster. The first round warms caches and is not counted.

    .venv/bin/python -m loadtests.bench_kube --runs 20 --warm 2 [--real-node [--guard]]
"""

from __future__ import annotations

import argparse
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import httpx

from executor.envd import ENVD_PORT
from kube_dev._control_plane import load_layout
from loadtests._stats import percentile
from loadtests.bench_create import _first_command
from tests.kube_fixtures import SCRIPT, Kube, free_port_pair
from tests.polling import wait_for
from tests.real_node_fixtures import RealNode, install_templates
from tests.scale_to_zero_fixtures import host, metric
from tests.server_fixtures import RunningServer, free_port, running_server

COLD_TEMPLATE = "sandbox-base-node"
GUARD_IMAGE = "agent-sandbox/gateway:0.1.0"  # the egress guard's (the gateway's image, as install.yaml has it)
REAL_NODE_COLD = "base-cold"  # the real node has sandbox-base's image alone: `base` again, with no pool
_AUTO_RESUME = {"onTimeout": "pause", "autoResume": True}
SERIES = {
    "cold-create": "cold create -> 201 (no pool, BASELINE)",
    "cold-create+cmd": "cold create + first command",
    "warm-claim": "warm claim -> 201 (base)",
    "warm-claim+cmd": "warm claim + first command",
    "running-get": "data-plane GET, running (BASELINE)",
    "pause": "pause -> paused (archive, zero pods)",
    "resume-held-get": "held data-plane GET, scaled to zero",
    "resume-connect": "connect -> 201, scaled to zero",
    "resume-connect+get": "connect + data-plane GET first byte",
}
Series = dict[str, list[float]]


@contextmanager
def dev_cluster(state: Path, *, real_node: bool = False) -> Iterator[Kube]:
    """A cluster of its own (`up`, with a real node if asked), stopped with `down` however the block ends."""
    up = [str(SCRIPT), "up", "--state-dir", str(state), "--port", str(free_port()), *(["--real-node"] * real_node)]
    state.mkdir()
    try:
        started = subprocess.run(
            [*up, "--etcd-port", str(free_port_pair())], capture_output=True, text=True, timeout=1200
        )
        if started.returncode != 0:
            raise RuntimeError(f"kube-dev-cluster up failed ({started.returncode}):\n{started.stderr}")
        yield Kube(load_layout(state), Path(started.stdout.strip().splitlines()[-1]))
    finally:
        down = subprocess.run([str(SCRIPT), "down", "--state-dir", str(state)], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        if down.returncode != 0:  # said, not swallowed: its state dir is about to go, and what runs with it
            print(f"kube-dev-cluster down failed ({down.returncode}):\n{down.stderr}", file=sys.stderr)


def new_namespace(kube: Kube) -> str:
    """A fresh namespace whose default ServiceAccount is ready (the cluster goes with it)."""
    name = f"bench-{secrets.token_hex(4)}"
    with kube.client() as client:
        client.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
        account = f"/api/v1/namespaces/{name}/serviceaccounts/default"

        def ready() -> bool:
            response = client.get(account)
            return response.status_code == 200 and bool(response.json().get("secrets"))

        wait_for(ready, what=f"the default ServiceAccount of {name}", within=60)
    return name


def data_plane_get(gateway_port: int, sandbox_id: str) -> tuple[float, float]:
    """GET envd's /health through the gateway on an open connection: when it was sent and its first byte came."""
    request = f"GET /health HTTP/1.1\r\nHost: {host(sandbox_id, ENVD_PORT)}\r\nConnection: close\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", gateway_port), timeout=180) as sock:
        sent = time.perf_counter()
        sock.sendall(request)
        first = sock.recv(1)
        answered = time.perf_counter()
        reply = first + b"".join(iter(lambda: sock.recv(65536), b""))
    if not reply.startswith(b"HTTP/1.1 204"):
        raise RuntimeError(f"sandbox {sandbox_id} answered {reply[:300]!r}")
    return sent, answered


class Bench:
    """One server's E2B API and data plane, and the cluster beside it, measured into `series`."""

    def __init__(
        self, server: RunningServer, api: httpx.Client, cluster: httpx.Client, namespace: str, cold_template: str
    ) -> None:
        self.server, self.api, self.cluster, self.cold_template = server, api, cluster, cold_template
        self.pods = f"/api/v1/namespaces/{namespace}/pods"
        self.live: set[str] = set()  # created and not killed yet: killed at the end whatever happens

    def settle(self, warm: int, sandbox_pods: int) -> None:
        """Wait until the pool is full with no refill starting, and `sandbox_pods` sandbox pods exist."""

        def quiet() -> bool:
            ready = metric(self.server, "agent_sandbox_warm_pool_ready", template="base")
            starting = metric(self.server, "agent_sandbox_warm_pool_starting", template="base")
            listed = self.cluster.get(self.pods, params={"labelSelector": "agent-sandbox.dev/role=sandbox"})
            return ready >= warm and not starting and len(listed.json()["items"]) == sandbox_pods

        wait_for(quiet, what=f"a full pool ({warm}), no refill and {sandbox_pods} sandbox pod(s)", within=180)

    def create(self, template: str, series: Series, name: str) -> str:
        """Create (timed to its 201 into `name`), then run a first command (timed into `name+cmd`)."""
        body: dict[str, object] = {"templateID": template, "timeout": 300, "lifecycle": _AUTO_RESUME}
        began = time.perf_counter()
        created = self.api.post("/v2/sandboxes", json=body)
        series[name].append((time.perf_counter() - began) * 1000)
        if created.status_code != 201:
            raise RuntimeError(f"create {template}: {created.status_code} {created.text}")
        sandbox_id: str = created.json()["sandboxID"]
        self.live.add(sandbox_id)
        _first_command(self.api, sandbox_id, created.json()["envdAccessToken"])
        series[f"{name}+cmd"].append((time.perf_counter() - began) * 1000)
        return sandbox_id

    def pause(self, sandbox_id: str, series: Series | None = None) -> None:
        """E2B's pause: the sandbox's files archived and its ReplicaSet scaled to zero (timed into `pause`)."""
        began = time.perf_counter()
        paused = self.api.post(f"/sandboxes/{sandbox_id}/pause")
        if paused.status_code != 204:
            raise RuntimeError(f"pause {sandbox_id}: {paused.status_code} {paused.text}")

        def paused_now() -> bool:
            return bool(self.api.get(f"/sandboxes/{sandbox_id}").json().get("state") == "paused")

        wait_for(paused_now, what=f"{sandbox_id} to be paused", within=60)
        if series is not None:
            series["pause"].append((time.perf_counter() - began) * 1000)

    def connect(self, sandbox_id: str, series: Series) -> None:
        began = time.perf_counter()
        connected = self.api.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 300})
        series["resume-connect"].append((time.perf_counter() - began) * 1000)
        if connected.status_code != 201:
            raise RuntimeError(f"connect {sandbox_id}: {connected.status_code} {connected.text}")
        _, answered = data_plane_get(self.server.port, sandbox_id)
        series["resume-connect+get"].append((answered - began) * 1000)

    def get(self, sandbox_id: str, series: Series, name: str) -> None:
        sent, answered = data_plane_get(self.server.port, sandbox_id)
        series[name].append((answered - sent) * 1000)

    def kill(self, sandbox_id: str) -> None:
        self.api.delete(f"/sandboxes/{sandbox_id}")
        self.live.discard(sandbox_id)

    def round(self, warm: int, series: Series) -> None:
        self.settle(warm, 0)
        self.kill(self.create(self.cold_template, series, "cold-create"))
        self.settle(warm, 0)
        sandbox_id = self.create("base", series, "warm-claim")
        self.settle(warm, 1)
        self.get(sandbox_id, series, "running-get")
        self.pause(sandbox_id, series)
        self.settle(warm, 0)
        self.get(sandbox_id, series, "resume-held-get")
        self.pause(sandbox_id)
        self.settle(warm, 0)
        self.connect(sandbox_id, series)
        self.kill(sandbox_id)


def _real_node_templates(directory: Path) -> Path:
    """install.yaml's templates (their images are the Dockerfiles'), and `base` again as `base-cold`."""
    templates = install_templates(directory)
    base = (templates / "base.toml").read_text()
    (templates / f"{REAL_NODE_COLD}.toml").write_text(base.replace('name = "base"', f'name = "{REAL_NODE_COLD}"', 1))
    return templates


def measure(kube: Kube, runs: int, warm: int, tmp: Path, *, real_node: bool = False, guard: bool = False) -> Series:
    tmp.mkdir(parents=True, exist_ok=True)
    namespace = new_namespace(kube)
    args = ["--runtime", "kubernetes", "--kubeconfig", str(kube.kubeconfig), "--namespace", namespace,
            "--warm", f"base={warm}", "--pause-after", "0", "--snapshot-after", "0"]  # fmt: skip
    if guard:
        args += ["--kube-egress-guard-image", GUARD_IMAGE]
    if real_node:
        node = RealNode(kube)
        args += ["--templates", str(_real_node_templates(tmp / "templates"))]
        server_port = free_port()
        serving = running_server(tmp / "data", *args, env=env_key(), port=server_port, wrap=node.in_namespace())
        bridge: AbstractContextManager[object] = node.bridged(server_port)
    else:  # the stand-in runs executors on the host, which has no `user` account
        serving = running_server(tmp / "data", *args, "--kube-sandbox-user", "root", env=env_key())
        bridge = nullcontext()
    series: Series = {name: [] for name in SERIES}
    try:
        with (
            bridge,
            serving as server,
            httpx.Client(base_url=server.url, headers={"X-API-Key": server.api_key}, timeout=180) as api,
            kube.client() as cluster,
        ):
            bench = Bench(server, api, cluster, namespace, REAL_NODE_COLD if real_node else COLD_TEMPLATE)
            try:
                bench.round(warm, {name: [] for name in SERIES})  # warm-up, not counted
                for _ in range(runs):
                    bench.round(warm, series)
            finally:
                for sandbox_id in list(bench.live):
                    bench.kill(sandbox_id)
    except BaseException:
        log = tmp / "data.server.log"
        tail = log.read_text().splitlines()[-60:] if log.exists() else []
        print("the server's log, last lines:", *tail, sep="\n", file=sys.stderr)
        raise
    return series


def env_key() -> dict[str, str]:
    return {"AGENT_SANDBOX_API_KEY": f"e2b_{secrets.token_hex(16)}"}


def _row(values: list[float]) -> str:
    return f"{len(values):>4} " + " ".join(f"{percentile(values, q):9.1f}" for q in (50, 90, 99))


def report(series: Series, warm: int, real: Series | None = None, guarded: Series | None = None) -> None:
    print(
        f"Kubernetes dev cluster; warm pool base={warm}, cold creates use a template with no pool; ratios are p50 / p50"
    )
    header = f"{'series':<20} {'what':<40} {'n':>4} {'p50':>9} {'p90':>9} {'p99':>9}"
    if real is None:
        print(f"{header}  (ms)")
    else:
        print(f"{header}  | real node: {'n':>4} {'p50':>9} {'p90':>9} {'p99':>9}  real/stand-in p50  (ms)")
    for name, label in SERIES.items():
        line = f"{name:<20} {label:<40} {_row(series[name])}"
        if real is not None:
            ratio = percentile(real[name], 50) / percentile(series[name], 50)
            line += f"  | real node: {_row(real[name])}  x{ratio:.2f}"
        print(line)
    if real is not None and guarded is not None:
        print("real node with the egress guard in every pod (--guard), against the real node without it:")
        for name, label in SERIES.items():
            ratio = percentile(guarded[name], 50) / percentile(real[name], 50)
            print(f"{name:<20} {label:<40} {_row(guarded[name])}  x{ratio:.2f}")
    for name, figures in (("stand-in", series), ("real node", real), ("real node, guarded", guarded)):
        if figures is None:
            continue
        p50 = {key: percentile(values, 50) for key, values in figures.items()}
        print(
            f"ratios ({name}): cold/warm create x{p50['cold-create'] / p50['warm-claim']:.2f}, "
            f"cold/warm create+cmd x{p50['cold-create+cmd'] / p50['warm-claim+cmd']:.2f}, "
            f"held resume/running x{p50['resume-held-get'] / p50['running-get']:.1f}, "
            f"connect+get/running x{p50['resume-connect+get'] / p50['running-get']:.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warm", type=int, default=2, help="warm pods kept ready for `base` (at least 1)")
    parser.add_argument(
        "--real-node", action="store_true",
        help="also measure a real node (kubelet + containerd, the Dockerfiles' images), printed beside the stand-in",
    )  # fmt: skip
    parser.add_argument(
        "--guard", action="store_true",
        help="with --real-node: measure the real node again with the egress guard in every pod, beside it without",
    )  # fmt: skip
    args = parser.parse_args()
    if args.runs < 1 or args.warm < 1:
        parser.error("--runs and --warm must be at least 1")
    if args.guard and not args.real_node:
        parser.error("--guard needs --real-node (the stand-in kubelet runs no egress guard)")
    with tempfile.TemporaryDirectory(prefix="bench-kube-") as tmp, dev_cluster(Path(tmp) / "cluster") as kube:
        series = measure(kube, args.runs, args.warm, Path(tmp))
    real = guarded = None
    if args.real_node:
        with (
            tempfile.TemporaryDirectory(prefix="bench-kube-real-") as tmp,
            dev_cluster(Path(tmp) / "cluster", real_node=True) as kube,
        ):
            real = measure(kube, args.runs, args.warm, Path(tmp) / "plain", real_node=True)
            if args.guard:
                guarded = measure(kube, args.runs, args.warm, Path(tmp) / "guarded", real_node=True, guard=True)
    report(series, args.warm, real, guarded)


if __name__ == "__main__":
    main()
