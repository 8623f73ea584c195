"""Pause and snapshots of the kubernetes runtime on the dev cluster: freeze/thaw inside the pod, the working
directory kept in archive Secrets while the ReplicaSet is scaled to zero, and restored by any replica."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import msgspec
import pytest

from executor.envd import ENVD_PORT
from pool import RuntimeFailure, SandboxGone
from pool._executor_client import start_process
from pool._kube import KubeApi, KubernetesRuntime, KubeSettings, load_kubeconfig
from tests import kube_fixtures
from tests.kube_fixtures import Kube, live_pods
from tests.polling import wait_for, wait_for_async
from tests.sandbox_exec import run_in_sandbox
from tests.test_kube_runtime import BASE, kube_runtime, pod_ip, spec

kube = kube_fixtures.kube
kube_namespace = kube_fixtures.kube_namespace

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

TOKEN = "tok-snapshot"
IN_POD_DIR = 'cd "$(readlink /proc/$PPID/cwd)"'  # the executor's cwd: the pod's directory, the archived one
# The template's start command marks each run in the pod's directory: after a restore the mark of the first run
# is back from the archive, and one more follows it (the files are back before the start commands run).
MARKED = msgspec.structs.replace(BASE, start=(f"{IN_POD_DIR}; echo started >> starts",))


def _pod_dir(kube: Kube, namespace: str, sandbox_id: str) -> Path:
    """The pod's directory on this host: the cwd of the executor listening on the sandbox's pod IP."""
    ip = pod_ip(kube, namespace, sandbox_id)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if b"executor" in argv and ip.encode() in argv:
                return Path(os.readlink(cmdline.parent / "cwd"))
    raise AssertionError(f"no executor at {ip}")


def _objects(kube: Kube, namespace: str, kind: str, selector: str) -> list[dict[str, object]]:
    listed = kube.kubectl("get", kind, "-n", namespace, "-l", selector, "-o", "json")
    items: list[dict[str, object]] = msgspec.json.decode(listed)["items"]
    return items


def _archive_secrets(kube: Kube, namespace: str, sandbox_id: str) -> list[dict[str, object]]:
    return _objects(
        kube, namespace, "secrets", f"agent-sandbox.dev/role=sandbox-archive,agent-sandbox.dev/sandbox-id={sandbox_id}"
    )


def _wait_for_text(path: Path, text: str) -> None:
    wait_for(lambda: path.exists() and path.read_text() == text, what=f"{text!r} in {path.name}")


def _ready(kube: Kube, namespace: str, sandbox_id: str) -> bool:
    pods = _objects(kube, namespace, "pods", f"agent-sandbox.dev/sandbox-id={sandbox_id}")
    conditions = [c for pod in pods for c in pod.get("status", {}).get("conditions", [])]  # type: ignore[attr-defined]
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _count(directory: Path) -> int:
    """The counter's value, 0 until it has written one (a login shell starts it: its profile runs first)."""
    with contextlib.suppress(OSError, ValueError):
        return int((directory / "count").read_text())
    return 0


async def _counts_on(directory: Path) -> None:
    before = await wait_for_async(lambda: _count(directory), what="the counter to write")
    await wait_for_async(lambda: _count(directory) > before, what="the counter to count on")


async def _stands_still(directory: Path, seconds: float = 0.4) -> bool:
    before = await wait_for_async(lambda: _count(directory), what="the counter to write")
    await asyncio.sleep(seconds)
    return _count(directory) == before


async def _start_counter(rt: KubernetesRuntime, sandbox_id: str) -> None:
    loop = f"{IN_POD_DIR}; i=0; while true; do i=$((i+1)); echo $i > count.tmp; mv count.tmp count; sleep 0.02; done"
    sock = await rt.open_socket(sandbox_id, ENVD_PORT)
    await start_process(sock, loop, tag="counter", user="root", token=TOKEN)


async def test_freeze_stops_a_loop_in_the_pod_and_thaw_resumes_it(kube: Kube, kube_namespace: str) -> None:
    async with kube_runtime(kube.kubeconfig, kube_namespace) as rt:
        await rt.start(spec("pausing", token=TOKEN))
        await _start_counter(rt, "pausing")
        directory = _pod_dir(kube, kube_namespace, "pausing")
        await _counts_on(directory)
        await rt.freeze("pausing")
        await rt.freeze("pausing")  # idempotent
        assert await _stands_still(directory)
        assert rt.is_running("pausing")  # the pod stays; its executor answers
        assert (await rt.stats("pausing")).mem_total > 0
        await rt.thaw("pausing")
        await _counts_on(directory)
        await rt.stop("pausing")


async def test_the_census_counts_only_template_processes_as_restorable(kube: Kube, kube_namespace: str) -> None:
    async with kube_runtime(kube.kubeconfig, kube_namespace) as rt:
        await rt.start(spec("census", MARKED, token=TOKEN))
        assert not rt.snapshot_keeps_processes("census")  # no answer yet: the careful one
        await rt.freeze("census")
        assert rt.snapshot_keeps_processes("census")  # only the (finished) start command ran
        await rt.thaw("census")
        await _start_counter(rt, "census")
        await rt.freeze("census")
        assert not rt.snapshot_keeps_processes("census")  # the counter would be lost
        await rt.stop("census")
        with pytest.raises(SandboxGone):
            rt.snapshot_keeps_processes("census")


async def test_snapshot_scales_to_zero_and_restore_brings_the_files_back(kube: Kube, kube_namespace: str) -> None:
    async with kube_runtime(kube.kubeconfig, kube_namespace) as rt:
        await rt.start(spec("keeper", MARKED, token=TOKEN))
        before = _pod_dir(kube, kube_namespace, "keeper")
        (before / "notes.txt").write_text("written before the snapshot")
        await asyncio.to_thread(_wait_for_text, before / "starts", "started\n")
        await rt.freeze("keeper")
        info = await rt.snapshot("keeper")
        assert (info.kind, info.image_bytes > 0) == ("filesystem", True)
        again = await rt.snapshot("keeper")  # snapshotted already: nothing to do
        assert (again.kind, again.image_bytes) == (info.kind, info.image_bytes)
        assert (rt.is_snapshotted("keeper"), rt.is_running("keeper")) == (True, False)
        assert rt.snapshotted_ids() == {"keeper"}
        assert live_pods(kube, kube_namespace, "keeper") == []  # a deleted pod whose containers ended counts as gone
        replica_set = msgspec.json.decode(
            kube.kubectl("get", "rs", "sandbox-keeper", "-n", kube_namespace, "-o", "json")
        )
        assert replica_set["spec"]["replicas"] == 0
        assert replica_set["metadata"]["annotations"]["agent-sandbox.dev/snapshot"] == "filesystem"
        secrets = _archive_secrets(kube, kube_namespace, "keeper")
        assert [s["metadata"]["ownerReferences"] for s in secrets] == [[{  # type: ignore[index]
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "sandbox-keeper",
            "uid": replica_set["metadata"]["uid"], "controller": False, "blockOwnerDeletion": True,
        }]]  # fmt: skip

        await rt.restore(spec("keeper", MARKED, token=TOKEN))
        after = _pod_dir(kube, kube_namespace, "keeper")
        assert after != before
        assert (after / "notes.txt").read_text() == "written before the snapshot"
        await asyncio.to_thread(_wait_for_text, after / "starts", "started\nstarted\n")
        assert (rt.is_snapshotted("keeper"), rt.is_running("keeper")) == (False, True)
        assert not _archive_secrets(kube, kube_namespace, "keeper")
        result = await run_in_sandbox(rt, "keeper", "echo back", user="root", token=TOKEN)
        assert result.stdout == "back\n"
        await rt.restore(spec("keeper", MARKED, token=TOKEN))  # running: nothing to do
        with pytest.raises(SandboxGone):
            await rt.restore(spec("nosuch"))
        await rt.stop("keeper")


async def test_a_second_runtime_restores_what_the_first_snapshotted(kube: Kube, kube_namespace: str) -> None:
    async with kube_runtime(kube.kubeconfig, kube_namespace) as first:
        await first.start(spec("wanderer", token=TOKEN))
        (_pod_dir(kube, kube_namespace, "wanderer") / "notes.txt").write_text("from the first")
        await first.snapshot("wanderer")
    async with kube_runtime(kube.kubeconfig, kube_namespace) as second:
        assert await second.recover() == set()
        assert second.snapshotted_ids() == {"wanderer"}
        await second.restore(spec("wanderer", token=TOKEN))
        assert (_pod_dir(kube, kube_namespace, "wanderer") / "notes.txt").read_text() == "from the first"
        await second.stop("wanderer")


async def test_a_restore_cut_short_is_started_over(kube: Kube, kube_namespace: str) -> None:
    async with kube_runtime(kube.kubeconfig, kube_namespace) as rt:
        await rt.start(spec("phoenix", token=TOKEN))
        (_pod_dir(kube, kube_namespace, "phoenix") / "notes.txt").write_text("kept")
        await rt.snapshot("phoenix")
        kube.kubectl("scale", "rs", "sandbox-phoenix", "-n", kube_namespace, "--replicas=1")  # as a crash leaves it
        await asyncio.to_thread(wait_for, lambda: _ready(kube, kube_namespace, "phoenix"), what="the half-restored pod")
        assert (rt.is_snapshotted("phoenix"), rt.is_running("phoenix")) == (True, False)
        await rt.restore(spec("phoenix", token=TOKEN))
        assert (_pod_dir(kube, kube_namespace, "phoenix") / "notes.txt").read_text() == "kept"
        await rt.stop("phoenix")


async def test_stop_deletes_the_replica_set_and_its_archive_secrets(kube: Kube, kube_namespace: str) -> None:
    async def main() -> None:
        async with kube_runtime(kube.kubeconfig, kube_namespace) as rt:
            await rt.start(spec("doomed", token=TOKEN))
            await rt.snapshot("doomed")
            assert _archive_secrets(kube, kube_namespace, "doomed")
            await rt.stop("doomed")
            assert not rt.is_snapshotted("doomed")

    await main()
    assert kube.kubectl("get", "replicasets", "-n", kube_namespace, "-o", "name") == ""
    wait_for(lambda: not _archive_secrets(kube, kube_namespace, "doomed"), what="the garbage collector")


async def test_an_archive_over_the_limit_is_refused_and_the_sandbox_runs_on(kube: Kube, kube_namespace: str) -> None:
    settings = KubeSettings(namespace=kube_namespace, sandbox_user="root", archive_limit=64 << 10)
    rt = KubernetesRuntime(KubeApi(load_kubeconfig(kube.kubeconfig)), settings)
    try:
        await rt.start(spec("hoarder", token=TOKEN))
        (_pod_dir(kube, kube_namespace, "hoarder") / "noise").write_bytes(os.urandom(256 << 10))  # does not compress
        with pytest.raises(RuntimeFailure, match=r"was not snapshotted and runs on .* at most 0\.0625 MiB"):
            await rt.snapshot("hoarder")
        assert (rt.is_running("hoarder"), rt.is_snapshotted("hoarder")) == (True, False)
        assert (await run_in_sandbox(rt, "hoarder", "echo alive", user="root", token=TOKEN)).stdout == "alive\n"
        await rt.stop("hoarder")
    finally:
        await rt.aclose()
