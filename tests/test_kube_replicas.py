"""Two gateway replicas sharing one namespace of the dev cluster and one real Redis.

Each replica is a real `agent-sandbox serve --runtime kubernetes --redis-url ...` process with its own data dir;
the sandboxes, their records and the API key live in the cluster. What must hold: a replica sees sandboxes the
other created; a burst held on one replica is released by the resume the other does (one activation for the
sandbox, across replicas); killing the leader hands the background loops (reaper, warm pools) to the other
within the lease duration.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import signal
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.connection_config import ApiParams

from tests import kube_fixtures, redis_fixtures
from tests.kube_fixtures import Kube
from tests.polling import wait_for
from tests.scale_to_zero_fixtures import Reply, health_burst, metric
from tests.server_fixtures import RunningServer, free_port, running_server

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace
redis_server = redis_fixtures.redis_server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]

LEASE_SECONDS = 3.0
WARM = 2  # warm pods of the base template, claimed by creates on either replica
BURST = 200
SLOW_RESUME_SECONDS = 2
_RESUMED = "transition=snapshotted->running"


class Replicas:
    def __init__(self, a: RunningServer, b: RunningServer, logs: tuple[Path, Path]) -> None:
        self.a, self.b = a, b
        self.logs = logs

    def log(self, server: RunningServer) -> str:
        return self.logs[0 if server is self.a else 1].read_text()

    def sdk(self, server: RunningServer) -> ApiParams:
        """Connection options of the E2B SDK for `server` (the two replicas differ only in URL)."""
        return ApiParams(api_key=server.api_key, api_url=server.url, sandbox_url=server.url)


@pytest.fixture
def replicas(
    kube: Kube, kube_namespace: str, redis_server: redis_fixtures.RedisServer, tmp_path: Path
) -> Iterator[Replicas]:
    key = "e2b_" + secrets.token_hex(16)
    common = [
        "--runtime", "kubernetes", "--kubeconfig", str(kube.kubeconfig), "--namespace", kube_namespace,
        "--kube-sandbox-user", "root", "--redis-url", redis_server.url, "--lease-duration", str(LEASE_SECONDS),
        "--warm", f"base={WARM}",
    ]  # fmt: skip
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                running_server(tmp_path / name, *common, "--replica-id", name, env={"AGENT_SANDBOX_API_KEY": key})
            )
            for name in ("a", "b")
        ]
        yield Replicas(servers[0], servers[1], (tmp_path / "a.server.log", tmp_path / "b.server.log"))


def _leader(kube: Kube, namespace: str) -> str:
    out = kube.kubectl("get", "lease", "agent-sandbox-leader", "-n", namespace, "-o", "jsonpath={.spec.holderIdentity}")
    return out.strip()


def _replicas_of(kube: Kube, namespace: str, sandbox_id: str) -> str:
    return kube.kubectl(
        "get", "replicaset", f"sandbox-{sandbox_id}", "-n", namespace, "-o", "jsonpath={.spec.replicas}"
    ).strip()


def _paused_sandbox(replicas: Replicas, *, slow_resume: bool = False) -> tuple[Sandbox, str, str]:
    """A sandbox created on replica A with a file in its working directory, then paused (scaled to zero).

    `slow_resume`: its autostart command opens its port only after a while, and a resume waits for that port, so
    a resume certainly lasts long enough for a burst to arrive while it is under way (a warm pod makes it fast).
    """
    sbx = Sandbox.create(
        lifecycle={"on_timeout": "pause", "auto_resume": True}, timeout=240, **replicas.sdk(replicas.a)
    )
    workdir = sbx.commands.run("pwd").stdout.strip()
    marker = f"{workdir}/marker.txt"
    sbx.files.write(marker, "kept across the snapshot")
    if slow_resume:
        port = free_port()
        command = f"sleep {SLOW_RESUME_SECONDS}; exec python3 -m http.server {port} --bind 0.0.0.0"
        autostart = json.dumps({"command": command, "ports": [port]})
        sbx.files.write(f"{workdir}/.config/agent-sandbox/autostart.json", autostart)
    assert sbx.pause()
    return sbx, marker, workdir


def test_a_replica_sees_the_sandboxes_the_other_created(replicas: Replicas) -> None:
    sbx = Sandbox.create(timeout=120, **replicas.sdk(replicas.a))
    try:
        on_b = Sandbox.connect(sbx.sandbox_id, **replicas.sdk(replicas.b))
        assert on_b.commands.run("echo from b").stdout == "from b\n"
        listed = Sandbox.list(**replicas.sdk(replicas.b)).next_items()
        assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
        on_a = Sandbox.list(**replicas.sdk(replicas.a)).next_items()
        assert [s.sandbox_id for s in on_a] == [sbx.sandbox_id]  # so the wait below sees the kill, not a blank
        on_b.kill()
        wait_for(lambda: not Sandbox.list(**replicas.sdk(replicas.a)).next_items(), what="A to hear of the kill")
    finally:
        sbx.kill()


async def test_burst_held_on_one_replica_is_released_by_the_resume_of_the_other(
    replicas: Replicas, kube: Kube, kube_namespace: str
) -> None:
    sbx, marker, _ = _paused_sandbox(replicas, slow_resume=True)
    try:
        wait_for(lambda: _replicas_of(kube, kube_namespace, sbx.sandbox_id) == "0", what="the scale to zero")
        held_before = metric(replicas.b, "agent_sandbox_holds_total", result="resumed")
        with ThreadPoolExecutor(1) as pool:
            resume = pool.submit(lambda: Sandbox.connect(sbx.sandbox_id, timeout=240, **replicas.sdk(replicas.a)))
            # A holds the sandbox's activation lock once it scales the ReplicaSet back up: then burst B.
            wait_for(lambda: _replicas_of(kube, kube_namespace, sbx.sandbox_id) == "1", what="A to start the resume")
            replies = await health_burst(replicas.b.port, sbx.sandbox_id, BURST)
            resume.result(timeout=120)
        statuses = Counter(reply.status for reply in replies)
        assert len(statuses) == 1
        assert statuses[200] + statuses[204] == BURST
        assert statuses[204] == BURST  # the executor's /health answer, once woken
        assert replicas.log(replicas.a).count(_RESUMED) == 1
        assert _RESUMED not in replicas.log(replicas.b)  # B woke nothing itself: it waited for A's resume
        assert metric(replicas.b, "agent_sandbox_holds_total", result="resumed") - held_before > 0
        assert sbx.files.read(marker) == "kept across the snapshot"
    finally:
        sbx.kill()


async def test_one_activation_per_sandbox_across_replicas(replicas: Replicas) -> None:
    sbx, marker, _ = _paused_sandbox(replicas)
    try:

        async def both() -> list[Reply]:
            a, b = await asyncio.gather(
                health_burst(replicas.a.port, sbx.sandbox_id, BURST // 2),
                health_burst(replicas.b.port, sbx.sandbox_id, BURST // 2),
            )
            return a + b

        replies = await both()
        statuses = Counter(reply.status for reply in replies)
        assert len(statuses) == 1
        assert statuses[200] + statuses[204] == BURST
        assert statuses[204] == BURST  # the executor's /health answer, once woken
        resumes = replicas.log(replicas.a).count(_RESUMED) + replicas.log(replicas.b).count(_RESUMED)
        assert resumes == 1
        assert sbx.files.read(marker) == "kept across the snapshot"
    finally:
        sbx.kill()


def test_killing_the_leader_hands_the_background_loops_over(
    replicas: Replicas, kube: Kube, kube_namespace: str
) -> None:
    leader = wait_for(lambda: _leader(kube, kube_namespace), what="a leader")
    dead, survivor = (replicas.a, replicas.b) if leader == "a" else (replicas.b, replicas.a)
    survivor_id = "b" if leader == "a" else "a"
    took_over = re.compile(rf"\b{survivor_id}\b (leads|is now the leader)")
    assert not took_over.search(replicas.log(survivor))  # so the check below sees the takeover
    dead.process.send_signal(signal.SIGKILL)
    dead.process.wait(10)
    wait_for(
        lambda: _leader(kube, kube_namespace) not in ("", leader),
        what="the other replica to take the lease",
    )
    assert re.search(r"leader", replicas.log(survivor))
    wait_for(lambda: took_over.search(replicas.log(survivor)), what="the survivor to log its leadership")
    # The reaper now runs on the survivor: a sandbox past its timeout is killed there.
    sbx = Sandbox.create(timeout=2, **replicas.sdk(survivor))
    assert f"sandbox-{sbx.sandbox_id}" in kube.kubectl("get", "replicasets", "-n", kube_namespace, "-o", "name")
    wait_for(
        lambda: (
            f"sandbox-{sbx.sandbox_id}" not in kube.kubectl("get", "replicasets", "-n", kube_namespace, "-o", "name")
        ),
        what="the survivor's reaper to kill the expired sandbox",
    )
    assert sbx.sandbox_id not in {s.sandbox_id for s in Sandbox.list(**replicas.sdk(survivor)).next_items()}


def _warm_ready(kube: Kube, namespace: str) -> int:
    pods = kube.kubectl(
        "get", "pods", "-n", namespace, "-l", "agent-sandbox.dev/pool=base",
        "-o", "jsonpath={.items[*].metadata.annotations.agent-sandbox\\.dev/warm-ready}",
    )  # fmt: skip
    return pods.split().count("true")


def _pod_of(kube: Kube, namespace: str, sandbox_id: str) -> tuple[str, str]:
    """(name, claimed-from label) of the sandbox's one pod."""
    out = kube.kubectl(
        "get", "pods", "-n", namespace, "-l", f"agent-sandbox.dev/sandbox-id={sandbox_id}",
        "-o", "jsonpath={.items[0].metadata.name} {.items[0].metadata.labels.agent-sandbox\\.dev/claimed-from}",
    )  # fmt: skip
    name, _, claimed = out.strip().partition(" ")
    return name, claimed


def test_creates_on_both_replicas_claim_distinct_warm_pods(replicas: Replicas, kube: Kube, kube_namespace: str) -> None:
    wait_for(lambda: _warm_ready(kube, kube_namespace) == WARM, what="the warm pool to fill", within=120)
    with ThreadPoolExecutor(WARM) as pool:
        made = list(
            pool.map(lambda server: Sandbox.create(timeout=120, **replicas.sdk(server)), (replicas.a, replicas.b))
        )
    try:
        pods = [_pod_of(kube, kube_namespace, sbx.sandbox_id) for sbx in made]
        assert len({name for name, _ in pods}) == WARM  # never two sandboxes on one pod
        assert [claimed for _, claimed in pods] == ["base"] * WARM  # both were warm claims, not cold starts
        assert [sbx.commands.run("echo ok").stdout for sbx in made] == ["ok\n"] * WARM
        # The pool's ReplicaSet replaces what was claimed; the leader warms the replacements.
        wait_for(lambda: _warm_ready(kube, kube_namespace) == WARM, what="the pool to refill", within=120)
    finally:
        for sbx in made:
            sbx.kill()


def _both_logged(replicas: Replicas, text: str) -> bool:
    return all(text in replicas.log(server) for server in (replicas.a, replicas.b))


def test_redis_going_down_degrades_to_replicas_working_alone_and_loses_nothing(
    replicas: Replicas, redis_server: redis_fixtures.RedisServer
) -> None:
    sbx = Sandbox.create(timeout=120, **replicas.sdk(replicas.a))
    redis_server.stop()
    try:
        assert sbx.commands.run("echo still here").stdout == "still here\n"
        on_b = Sandbox.connect(sbx.sandbox_id, **replicas.sdk(replicas.b))
        assert on_b.commands.run("echo via b").stdout == "via b\n"
        later = Sandbox.create(timeout=120, **replicas.sdk(replicas.b))
        assert Sandbox.connect(later.sandbox_id, **replicas.sdk(replicas.a)).commands.run("true").exit_code == 0
        wait_for(lambda: _both_logged(replicas, "unreachable: coordinating alone"), what="the warnings")
        listed = {s.sandbox_id for s in Sandbox.list(**replicas.sdk(replicas.a)).next_items()}
        assert {sbx.sandbox_id, later.sandbox_id} <= listed
        later.kill()
        # "is back" alone also matches the warning above ("... coordinating alone until it is back").
        back = "is back: coordinating with the other replicas again"
        assert not any(back in replicas.log(server) for server in (replicas.a, replicas.b))
        redis_server.start()
        wait_for(lambda: _both_logged(replicas, back), what="the reconnections")
    finally:
        sbx.kill()


def test_a_leader_stopped_cleanly_releases_the_lease_to_the_other(
    replicas: Replicas, kube: Kube, kube_namespace: str
) -> None:
    leader = wait_for(lambda: _leader(kube, kube_namespace), what="a leader")
    stopped, survivor = (replicas.a, replicas.b) if leader == "a" else (replicas.b, replicas.a)
    led_before = replicas.log(survivor).count("is now the leader")
    assert stopped.stop(signal.SIGTERM) == -signal.SIGTERM
    assert f"replica {leader} is no longer the leader" in replicas.log(stopped)
    assert "stopped: everything the server opened is closed" in replicas.log(stopped)
    wait_for(lambda: _leader(kube, kube_namespace) not in ("", leader), what="the other replica to take the lease")
    wait_for(lambda: "is now the leader" in replicas.log(survivor), what="the survivor to lead")
    assert replicas.log(survivor).count("is now the leader") > led_before  # it took over now, not earlier
