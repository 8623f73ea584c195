"""The kubernetes runtime against the real apiserver, controller-manager and stand-in kubelet of the dev cluster."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from gateway._settings import DEFAULT_TEMPLATES
from kube_dev._daemons import running_pid
from pool import ExecutorInit, ForkImage, PortClosed, RuntimeFailure, SandboxGone, SandboxSpec, Template, load_templates
from pool._kube import KubeApi, KubernetesRuntime, KubeSettings, load_kubeconfig
from tests import kube_fixtures
from tests.kube_fixtures import Kube, free_port
from tests.polling import wait_for
from tests.sandbox_exec import run_in_sandbox

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

BASE = load_templates(DEFAULT_TEMPLATES)["base"]
Scenario = Callable[[KubernetesRuntime], Awaitable[None]]


@contextlib.asynccontextmanager
async def kube_runtime(kubeconfig: Path, namespace: str) -> AsyncIterator[KubernetesRuntime]:
    # The dev cluster runs executors on the host, which has no `user` account: sandboxes run as root there.
    runtime = KubernetesRuntime(
        KubeApi(load_kubeconfig(kubeconfig)), KubeSettings(namespace=namespace, sandbox_user="root")
    )
    try:
        yield runtime
    finally:
        await runtime.aclose()


async def _run(kube: Kube, namespace: str, scenario: Scenario) -> None:
    async with kube_runtime(kube.kubeconfig, namespace) as runtime:
        await scenario(runtime)


# The dev cluster's sandboxes run on the host as root, so their login shells read its ~/.bashrc, whose `pyenv init`
# rehashes under a lock file that a shell killed meanwhile leaves behind: every later shell would wait 60 s for it.
_HOST_SHELL = {"PYENV_REHASH_TIMEOUT": "0"}


def spec(sandbox_id: str, template: Template = BASE, token: str | None = None) -> SandboxSpec:
    init = ExecutorInit(access_token=token, env_vars=_HOST_SHELL)
    return SandboxSpec(sandbox_id=sandbox_id, template=template, init=init)


async def _health(runtime: KubernetesRuntime, sandbox_id: str) -> bytes:
    reader, writer = await asyncio.open_connection(sock=await runtime.open_socket(sandbox_id, 49983))
    writer.write(b"GET /health HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\n\r\n")
    try:
        return await reader.read()
    finally:
        writer.close()


def pod_ip(kube: Kube, namespace: str, sandbox_id: str) -> str:
    with kube.client() as client:
        params = {"labelSelector": f"agent-sandbox.dev/sandbox-id={sandbox_id}"}
        pods = client.get(f"/api/v1/namespaces/{namespace}/pods", params=params).json()["items"]
    assert len(pods) == 1
    return str(pods[0]["status"]["podIP"])


def _executor_running_at(ip: str) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if b"executor" in argv and ip.encode() in argv:
                return True
    return False


async def test_started_sandbox_answers_health_and_runs_commands(kube: Kube, kube_namespace: str) -> None:
    async def scenario(rt: KubernetesRuntime) -> None:
        owned = msgspec.structs.replace(
            spec("hello", token="tok-never-in-objects"), annotations={"example.com/owner": "k1"}
        )
        await rt.start(owned)
        assert rt.is_running("hello")
        assert (await _health(rt, "hello")).startswith(b"HTTP/1.1 204")
        result = await run_in_sandbox(rt, "hello", "echo hi; id -un", user="root", token="tok-never-in-objects")
        assert (result.exit_code, result.stdout.split()) == (0, ["hi", "root"])
        assert (await rt.stats("hello")).mem_total > 0

    await _run(kube, kube_namespace, scenario)
    replica_set = kube.kubectl("get", "replicaset", "sandbox-hello", "-n", kube_namespace, "-o", "json")
    metadata = msgspec.json.decode(replica_set)["metadata"]
    assert metadata["annotations"] == {"example.com/owner": "k1"}
    labels = metadata["labels"]
    assert labels == {
        "agent-sandbox.dev/role": "sandbox",
        "agent-sandbox.dev/sandbox-id": "hello",
        "agent-sandbox.dev/template": "base",
    }
    pods = kube.kubectl("get", "pods", "-n", kube_namespace, "-o", "json")
    assert "tok-never-in-objects" not in replica_set + pods


async def test_start_runs_the_template_commands_and_waits_for_their_ports(kube: Kube, kube_namespace: str) -> None:
    port = free_port()
    server = msgspec.structs.replace(BASE, start=(f"exec python3 -m http.server --bind 0.0.0.0 {port}",), ports=(port,))

    async def scenario(rt: KubernetesRuntime) -> None:
        await rt.start(spec("withport", server))
        (await rt.open_socket("withport", port)).close()
        with pytest.raises(PortClosed):
            await rt.open_socket("withport", free_port())
        await rt.stop("withport")

    await _run(kube, kube_namespace, scenario)


async def test_a_fork_is_refused_and_creates_nothing(kube: Kube, kube_namespace: str) -> None:
    image = ForkImage(source_id="source", key="k", access_token=None, seconds=0.0, image_bytes=0)

    async def scenario(rt: KubernetesRuntime) -> None:
        with pytest.raises(RuntimeFailure, match="Kubernetes sandboxes do not fork"):
            await rt.start(msgspec.structs.replace(spec("forked"), fork=image))
        assert not rt.is_running("forked")

    await _run(kube, kube_namespace, scenario)
    assert kube.kubectl("get", "replicasets", "-n", kube_namespace, "-o", "name") == ""


async def test_stop_deletes_the_replica_set_and_the_executor_process(kube: Kube, kube_namespace: str) -> None:
    ips: list[str] = []

    async def scenario(rt: KubernetesRuntime) -> None:
        await rt.start(spec("goner"))
        ips.append(pod_ip(kube, kube_namespace, "goner"))
        assert _executor_running_at(ips[0])
        await rt.stop("goner")
        await rt.stop("goner")  # idempotent
        assert not rt.is_running("goner")
        with pytest.raises(SandboxGone):
            await rt.open_socket("goner", 49983)

    await _run(kube, kube_namespace, scenario)
    assert kube.kubectl("get", "replicasets,pods", "-n", kube_namespace, "-o", "name") == ""
    wait_for(lambda: not _executor_running_at(ips[0]), what="the executor process to end")


async def test_a_stop_does_not_fail_when_the_kubelet_ends_the_deleted_pod_late(
    kube: Kube, kube_namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Long enough for the ReplicaSet's deletion to be seen on a busy machine, short next to a kubelet held still.
    settings = KubeSettings(namespace=kube_namespace, sandbox_user="root", stop_timeout=3.0)
    runtime = KubernetesRuntime(KubeApi(load_kubeconfig(kube.kubeconfig)), settings)
    kubelet = running_pid(kube.layout.run, "kubelet")
    assert kubelet is not None
    try:
        await runtime.start(spec("slow-goner"))
        ip = pod_ip(kube, kube_namespace, "slow-goner")
        os.kill(kubelet, signal.SIGSTOP)  # a kubelet that does not get round to the deleted pod for a while
        try:
            await runtime.stop("slow-goner")
        finally:
            os.kill(kubelet, signal.SIGCONT)
    finally:
        await runtime.aclose()
    assert "slow-goner: stopped, but the kubelet has not ended its pods yet" in caplog.text
    assert "pod sandbox-slow-goner-" in caplog.text  # which pod
    assert "deleted at" in caplog.text  # in which state
    wait_for(lambda: not _executor_running_at(ip), what="the executor process to end")
    wait_for(lambda: kube.kubectl("get", "pods", "-n", kube_namespace, "-o", "name") == "", what="the pod to go")


async def test_a_new_runtime_recovers_running_sandboxes(kube: Kube, kube_namespace: str) -> None:
    async with kube_runtime(kube.kubeconfig, kube_namespace) as first:
        await first.start(spec("survivor"))
    async with kube_runtime(kube.kubeconfig, kube_namespace) as second:
        assert not second.is_running("survivor")
        assert await second.recover() == {"survivor"}
        assert (await _health(second, "survivor")).startswith(b"HTTP/1.1 204")
        await second.stop("survivor")


async def test_a_second_runtime_acts_on_a_sandbox_the_first_started(kube: Kube, kube_namespace: str) -> None:
    async with (
        kube_runtime(kube.kubeconfig, kube_namespace) as first,
        kube_runtime(kube.kubeconfig, kube_namespace) as second,
    ):
        await first.start(spec("shared", token="tok-shared"))
        with pytest.raises(RuntimeFailure, match="note_spec"):
            await second.stats("shared")  # its executor wants the token, which this process never saw
        second.note_spec(spec("shared", token="tok-shared"))
        assert (await second.stats("shared")).mem_total > 0
        assert second.is_running("shared")
        await second.freeze("shared")
        await second.thaw("shared")
        result = await run_in_sandbox(second, "shared", "echo via second", user="root", token="tok-shared")
        assert result.stdout == "via second\n"
        await second.stop("shared")
        assert not second.is_running("shared")
        await asyncio.to_thread(wait_for, lambda: not first.is_running("shared"), what="the first to see it go")


async def test_a_sandbox_created_a_moment_ago_elsewhere_is_found_before_the_watch_shows_it(
    kube: Kube, kube_namespace: str
) -> None:
    async with kube_runtime(kube.kubeconfig, kube_namespace) as first:
        await first.start(spec("fresh"))
        async with kube_runtime(kube.kubeconfig, kube_namespace) as second:
            # An unknown sandbox is looked up once before it counts as gone: no watch has started yet here.
            assert (await _health(second, "fresh")).startswith(b"HTTP/1.1 204")
            with pytest.raises(SandboxGone):
                await second.open_socket("nosuch", 49983)
        await first.stop("fresh")
