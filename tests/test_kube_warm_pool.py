"""Warm pools on Kubernetes against the dev cluster's real apiserver, ReplicaSet controller and garbage collector.

The template's start command is a tiny server that binds the port of its own pod's IP and logs that IP once
per start, so a test can tell which pods ran their start commands, and how often.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway._settings import DEFAULT_TEMPLATES
from pool import ALL_TRAFFIC, EgressRules, ExecutorInit, SandboxSpec, Template, load_templates
from pool._kube import KubeApi, KubernetesRuntime, KubeSettings, load_kubeconfig
from pool._kube._manifest import Pod, replica_set
from pool._kube._pool_manifest import is_claimed_warm_pod
from pool._kube._warm import KubeWarmPools
from tests import kube_fixtures
from tests.kube_fixtures import Kube, free_port
from tests.polling import wait_for_async
from tests.sandbox_exec import run_in_sandbox

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

BASE = load_templates(DEFAULT_TEMPLATES)["base"]
EGRESS_LABEL = "agent-sandbox.dev/egress"
INIT = ExecutorInit(env_vars={"GREETING": "hello from the claim"}, access_token="claim-token")
_SERVER = """\
import http.server, os, sys
pid = os.getppid()
while True:  # up to the executor (started as `executor --host <pod IP>`): the pod's own address
    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    if b"--host" in argv:
        ip = argv[argv.index(b"--host") + 1].decode()
        break
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
server = http.server.ThreadingHTTPServer((ip, int(sys.argv[1])), http.server.SimpleHTTPRequestHandler)
with open(sys.argv[2], "a") as log:
    log.write(ip + "\\n")
server.serve_forever()
"""


class Cluster:
    """The test's side of the namespace: raw API calls, and what it reads back from them."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.ns = f"/api/v1/namespaces/{namespace}"
        self.rs_path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"

    async def get(self, path: str, **params: str) -> Any:
        return msgspec.json.decode(await self.api.call("GET", path, params=params))

    async def pods(self, selector: str) -> list[Any]:
        listed = await self.get(f"{self.ns}/pods", labelSelector=selector)
        return [pod for pod in listed["items"] if not pod["metadata"].get("deletionTimestamp")]

    async def sandbox_pod(self, sandbox_id: str) -> Any:
        pods = await self.pods(f"agent-sandbox.dev/sandbox-id={sandbox_id}")
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket:
        """What `run_in_sandbox` needs: a socket to the sandbox's pod."""
        ip = (await self.sandbox_pod(sandbox_id))["status"]["podIP"]
        return socket.create_connection((ip, port), timeout=5)


@pytest.fixture
def start_log(tmp_path: Path) -> Path:
    return tmp_path / "starts.log"


@pytest.fixture
def template(tmp_path: Path, start_log: Path) -> Template:
    server = tmp_path / "server.py"
    server.write_text(_SERVER)
    port = free_port()
    return msgspec.structs.replace(
        BASE, start=(f"exec {sys.executable} {server} {port} {start_log} 2>>{tmp_path / 'server.err'}",), ports=(port,)
    )


def starts(start_log: Path) -> list[str]:
    """The pod IPs whose start command ran, once per run."""
    return start_log.read_text().split() if start_log.exists() else []


async def until(pools: KubeWarmPools, check: Callable[[], bool], what: str, within: float = 30.0) -> None:
    """Wait on the pools' own change notifications until `check()` holds."""
    try:
        async with asyncio.timeout(within):
            while not check():
                await pools.changed()
    except TimeoutError:
        pytest.fail(f"timed out after {within:g} s waiting for {what}: {pools.stats()}")


def ready(pools: KubeWarmPools, count: int) -> Callable[[], bool]:
    return lambda: pools.stats()["base"].ready == count


Pools = Callable[..., contextlib.AbstractAsyncContextManager[KubeWarmPools]]
Scenario = Callable[[Cluster, Pools], Awaitable[None]]
Run = Callable[[Scenario], Awaitable[None]]


@pytest.fixture
def run(kube: Kube, kube_namespace: str, template: Template) -> Run:
    """Runs a scenario with the namespace and a factory of warm pools (`leader=True`: running `run()` too)."""
    ids = (f"warm{n}" for n in itertools.count())

    async def main(scenario: Scenario) -> None:
        api = KubeApi(load_kubeconfig(kube.kubeconfig))

        @contextlib.asynccontextmanager
        async def warm_pools(
            target: int = 1, *, leader: bool = False, tpl: Template = template, ports_timeout: float = 30.0
        ) -> AsyncIterator[KubeWarmPools]:
            # The dev cluster runs executors on the host, which has no `user` account.
            settings = KubeSettings(namespace=kube_namespace, sandbox_user="root", ports_timeout=ports_timeout)
            pools = KubeWarmPools(api, settings, {"base": tpl}, new_id=lambda: next(ids), targets={"base": target})
            task = asyncio.create_task(pools.run()) if leader else None
            try:
                yield pools
            finally:
                await pools.close()
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)

        try:
            await scenario(Cluster(api, kube_namespace), warm_pools)
        finally:
            await api.aclose()

    return main


async def claim_warm_pod(cluster: Cluster, warm_pools: Pools) -> tuple[str, Any]:
    """Claim the pod of a pool of one once it is warm, with the pools closed again: the sandbox id and its pod."""
    async with warm_pools(1, leader=True) as pools:
        await until(pools, ready(pools, 1), "a warm-ready pod")
        sandbox_id = await pools.claim("base", INIT)
    assert sandbox_id is not None
    return sandbox_id, await cluster.sandbox_pod(sandbox_id)


async def test_the_pool_replica_set_keeps_its_target_of_pods_warm(
    run: Run, template: Template, start_log: Path
) -> None:
    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        async with warm_pools(2, leader=True) as pools:
            await until(pools, ready(pools, 2), "two warm-ready pods")
            pool = await cluster.get(f"{cluster.rs_path}/pool-base")
            assert pool["metadata"]["labels"] == {
                "agent-sandbox.dev/role": "warm",
                "agent-sandbox.dev/template": "base",
            }
            assert pool["spec"]["selector"] == {"matchLabels": {"agent-sandbox.dev/pool": "base"}}
            pods = await cluster.pods("agent-sandbox.dev/pool=base")
            assert [p["metadata"]["annotations"]["agent-sandbox.dev/warm-ready"] for p in pods] == ["true", "true"]
            assert "agent-sandbox.dev/sandbox-id" not in pods[0]["metadata"]["labels"]
            # Each pod ran its start command once, and its port is open.
            assert sorted(starts(start_log)) == sorted(p["status"]["podIP"] for p in pods)
            for pod in pods:
                socket.create_connection((pod["status"]["podIP"], template.ports[0]), timeout=5).close()
            stats = pools.stats()["base"]
            assert (stats.target, stats.starting, stats.refilled, stats.failures) == (2, 0, 2, 0)

    await run(scenario)


async def test_a_claim_moves_a_warm_pod_into_a_sandbox_and_the_pool_refills(run: Run, start_log: Path) -> None:
    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        async with warm_pools(1, leader=True) as pools:
            await until(pools, ready(pools, 1), "a warm-ready pod")
            [warm] = await cluster.pods("agent-sandbox.dev/pool=base")
            sandbox_id = await pools.claim("base", INIT)
            assert sandbox_id is not None
            pod = await cluster.sandbox_pod(sandbox_id)
            assert (pod["metadata"]["name"], pod["metadata"]["uid"]) == (
                warm["metadata"]["name"],
                warm["metadata"]["uid"],
            )
            assert pod["metadata"]["labels"] == {
                "agent-sandbox.dev/role": "sandbox",
                "agent-sandbox.dev/sandbox-id": sandbox_id,
                "agent-sandbox.dev/template": "base",
                "agent-sandbox.dev/claimed-from": "base",
            }
            # The caller's init took: its env var and its access token.
            result = await run_in_sandbox(cluster, sandbox_id, "echo $GREETING", user="root", token="claim-token")
            assert (result.exit_code, result.stdout) == (0, "hello from the claim\n")
            # The pool's ReplicaSet replaced the pod, and the leader warmed the replacement.
            await until(pools, ready(pools, 1), "the replacement to be warm")
            [replacement] = await cluster.pods("agent-sandbox.dev/pool=base")
            assert replacement["metadata"]["name"] != warm["metadata"]["name"]
            assert sorted(starts(start_log)) == sorted([warm["status"]["podIP"], replacement["status"]["podIP"]])
            assert (pools.stats()["base"].claims, pools.stats()["base"].refilled) == (1, 2)

    await run(scenario)


async def test_the_sandbox_replica_set_adopts_the_claimed_pod_and_deleting_it_deletes_the_pod(
    run: Run, template: Template, start_log: Path
) -> None:
    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        sandbox_id, pod = await claim_warm_pod(cluster, warm_pools)
        assert "ownerReferences" not in pod["metadata"]  # an orphan until its sandbox's ReplicaSet exists
        assert is_claimed_warm_pod(msgspec.convert(pod, Pod))  # what `KubernetesRuntime.start` checks
        # What `KubernetesRuntime.start` POSTs for the claimed id.
        spec = SandboxSpec(sandbox_id=sandbox_id, template=msgspec.structs.replace(template, user="root"), init=INIT)
        body = replica_set(spec, image_prefix="agent-sandbox/sandbox-", executor_args=("--default-user", "root"))
        rs = msgspec.json.decode(await cluster.api.call("POST", cluster.rs_path, body=body))

        async def adopted() -> Any:
            owners = (await cluster.sandbox_pod(sandbox_id))["metadata"].get("ownerReferences", [])
            return [(o["kind"], o["name"], o["uid"], o["controller"]) for o in owners]

        assert await wait_for_async(adopted, what="the sandbox ReplicaSet to adopt the pod") == [
            ("ReplicaSet", f"sandbox-{sandbox_id}", rs["metadata"]["uid"], True)
        ]

        async def settled() -> Any:
            status = (await cluster.get(f"{cluster.rs_path}/sandbox-{sandbox_id}"))["status"]
            return status.get("replicas") == status.get("readyReplicas") == 1

        await wait_for_async(settled, what="the sandbox ReplicaSet to count its one pod")
        assert (await cluster.sandbox_pod(sandbox_id))["metadata"]["uid"] == pod["metadata"]["uid"]  # no new pod
        assert starts(start_log).count(pod["status"]["podIP"]) == 1
        # The garbage collector deletes the adopted pod with its ReplicaSet.
        params = {"propagationPolicy": "Background"}
        await cluster.api.call("DELETE", f"{cluster.rs_path}/sandbox-{sandbox_id}", params=params)

        async def gone() -> bool:
            listed = await cluster.get(f"{cluster.ns}/pods", labelSelector=f"agent-sandbox.dev/sandbox-id={sandbox_id}")
            return not listed["items"]  # gone, not only being deleted

        await wait_for_async(gone, what="the adopted pod to go with its ReplicaSet")

    await run(scenario)


async def test_the_runtime_starts_a_claimed_sandbox_without_bringing_it_up_again(
    run: Run, template: Template, start_log: Path
) -> None:
    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        sandbox_id, pod = await claim_warm_pod(cluster, warm_pools)
        runtime = KubernetesRuntime(cluster.api, KubeSettings(namespace=cluster.namespace, sandbox_user="root"))
        try:
            await runtime.start(SandboxSpec(sandbox_id=sandbox_id, template=template, init=INIT))
            assert (await cluster.sandbox_pod(sandbox_id))["metadata"]["uid"] == pod["metadata"]["uid"]
            assert starts(start_log).count(pod["status"]["podIP"]) == 1
            result = await run_in_sandbox(runtime, sandbox_id, "echo $GREETING", user="root", token="claim-token")
            assert result.stdout == "hello from the claim\n"
            await runtime.stop(sandbox_id)
        finally:
            await runtime.aclose()  # closes `cluster.api` too, which tolerates a second `aclose`

    await run(scenario)


async def test_a_claimed_pod_gets_its_rules_before_its_replica_set_exists(run: Run, template: Template) -> None:
    """As the activator's create: `set_egress` right after the claim labels the pod (out of the shared internet
    policy), and `start` then creates the sandbox's own policy, owned by the ReplicaSet."""
    no_internet = EgressRules(deny_out=ALL_TRAFFIC)

    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        sandbox_id, _ = await claim_warm_pod(cluster, warm_pools)
        runtime = KubernetesRuntime(cluster.api, KubeSettings(namespace=cluster.namespace, sandbox_user="root"))
        try:
            await runtime.set_egress(sandbox_id, no_internet)
            assert (await cluster.sandbox_pod(sandbox_id))["metadata"]["labels"][EGRESS_LABEL] == "own"
            await runtime.start(SandboxSpec(sandbox_id=sandbox_id, template=template, init=INIT, egress=no_internet))
            policies = f"/apis/networking.k8s.io/v1/namespaces/{cluster.namespace}/networkpolicies"
            policy = await cluster.get(f"{policies}/sandbox-{sandbox_id}-egress")
            assert [o["name"] for o in policy["metadata"]["ownerReferences"]] == [f"sandbox-{sandbox_id}"]
            await runtime.stop(sandbox_id)
        finally:
            await runtime.aclose()  # closes `cluster.api` too, which tolerates a second `aclose`

    await run(scenario)


async def test_a_resume_from_zero_adopts_a_warm_pod_without_starting_it_again(
    run: Run, template: Template, start_log: Path
) -> None:
    in_pod_dir = 'cd "$(readlink /proc/$PPID/cwd)"'  # the executor's cwd: the pod's directory, the archived one

    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        runtime = KubernetesRuntime(cluster.api, KubeSettings(namespace=cluster.namespace, sandbox_user="root"))
        spec = SandboxSpec(sandbox_id="sleeper", template=template, init=INIT, egress=EgressRules(deny_out=ALL_TRAFFIC))
        try:
            async with warm_pools(1, leader=True) as pools:
                runtime.set_warm_source(pools.claim_for)
                await until(pools, ready(pools, 1), "a warm-ready pod")
                await runtime.start(spec)  # cold: the runtime claims only on resume (creates claim in the activator)
                written = await run_in_sandbox(
                    runtime, "sleeper", f"{in_pod_dir}; echo kept > notes.txt", user="root", token="claim-token"
                )
                assert written.exit_code == 0
                await runtime.snapshot("sleeper")
                [warm] = await cluster.pods("agent-sandbox.dev/pool=base")
                assert warm["metadata"]["annotations"]["agent-sandbox.dev/warm-ready"] == "true"

                await runtime.restore(spec)
                pod = await cluster.sandbox_pod("sleeper")
                assert (pod["metadata"]["name"], pod["metadata"]["uid"]) == (
                    warm["metadata"]["name"],
                    warm["metadata"]["uid"],
                )
                assert pod["metadata"]["labels"]["agent-sandbox.dev/claimed-from"] == "base"
                assert pod["metadata"]["labels"][EGRESS_LABEL] == "own"  # the warm pod had the internet
                assert [(o["name"], o["controller"]) for o in pod["metadata"]["ownerReferences"]] == [
                    ("sandbox-sleeper", True)
                ]
                read = await run_in_sandbox(
                    runtime, "sleeper", f"{in_pod_dir}; cat notes.txt", user="root", token="claim-token"
                )
                assert read.stdout == "kept\n"
                assert starts(start_log).count(warm["status"]["podIP"]) == 1  # when warmed, not again on resume
                assert (runtime.is_running("sleeper"), runtime.is_snapshotted("sleeper")) == (True, False)
                await until(pools, ready(pools, 1), "the pool to refill")
                [refill] = await cluster.pods("agent-sandbox.dev/pool=base")
                assert refill["metadata"]["name"] != warm["metadata"]["name"]
                assert pools.stats()["base"].claims == 1
                await runtime.stop("sleeper")
        finally:
            await runtime.aclose()  # closes `cluster.api` too, which tolerates a second `aclose`

    await run(scenario)


async def test_a_resume_with_no_warm_pod_ready_starts_a_new_pod_as_before(
    run: Run, template: Template, start_log: Path
) -> None:
    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        runtime = KubernetesRuntime(cluster.api, KubeSettings(namespace=cluster.namespace, sandbox_user="root"))
        spec = SandboxSpec(sandbox_id="napper", template=template, init=INIT)
        try:
            async with warm_pools(0, leader=True) as pools:
                runtime.set_warm_source(pools.claim_for)
                await runtime.start(spec)
                await runtime.snapshot("napper")
                await runtime.restore(spec)
                pod = await cluster.sandbox_pod("napper")
                assert "agent-sandbox.dev/claimed-from" not in pod["metadata"]["labels"]
                assert starts(start_log)[1:] == [pod["status"]["podIP"]]  # the restore ran the start command again
                assert (pools.stats()["base"].claims, pools.stats()["base"].misses) == (0, 1)
                await runtime.stop("napper")
        finally:
            await runtime.aclose()

    await run(scenario)


async def test_two_claimers_racing_for_one_warm_pod_never_share_it(run: Run) -> None:
    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        async with warm_pools(1, leader=True) as first, warm_pools(1) as second:
            assert await second.claim("base", INIT) is None  # nothing warm yet; starts the second one's pod cache
            await until(first, ready(first, 1), "a warm-ready pod")
            await until(second, ready(second, 1), "the second one to see it")
            claimed = [c for c in await asyncio.gather(first.claim("base", INIT), second.claim("base", INIT)) if c]
            assert len(claimed) == 1  # the replacement is far from warm when the loser's 409 comes back
            [pod] = [await cluster.sandbox_pod(sandbox_id) for sandbox_id in claimed]
            claimed_pods = await cluster.pods("agent-sandbox.dev/claimed-from")
            assert [p["metadata"]["name"] for p in claimed_pods] == [pod["metadata"]["name"]]
            stats = [pools.stats()["base"] for pools in (first, second)]
            assert [sum(s.claims for s in stats), sum(s.misses for s in stats), sum(s.discarded for s in stats)] == [
                1,
                2,
                0,
            ]

    await run(scenario)


async def test_a_claim_on_an_empty_pool_returns_none_at_once(run: Run) -> None:
    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        async with warm_pools(0, leader=True) as pools:
            async with asyncio.timeout(1.0):
                assert await pools.claim("base", INIT) is None
            assert await pools.claim("nosuch", INIT) is None
            stats = pools.stats()["base"]
            assert (stats.target, stats.ready, stats.misses) == (0, 0, 1)
            assert await cluster.pods("agent-sandbox.dev/role=warm") == []

    await run(scenario)


async def test_a_pod_whose_warming_fails_is_deleted_and_replaced(run: Run, template: Template) -> None:
    silent = msgspec.structs.replace(template, start=("sleep 600",))  # its port never opens

    async def scenario(cluster: Cluster, warm_pools: Pools) -> None:
        async with warm_pools(1, leader=True, tpl=silent, ports_timeout=0.5) as pools:
            [first] = await wait_for_async(lambda: cluster.pods("agent-sandbox.dev/pool=base"), what="a pool pod")
            await until(pools, lambda: pools.stats()["base"].failures == 1, "the warming to fail")

            async def replaced() -> bool:
                names = [p["metadata"]["name"] for p in await cluster.pods("agent-sandbox.dev/pool=base")]
                return len(names) == 1 and names != [first["metadata"]["name"]]

            await wait_for_async(replaced, what="the failed pod to be replaced")
            assert pools.stats()["base"].ready == 0
            assert await pools.claim("base", INIT) is None

    await run(scenario)
