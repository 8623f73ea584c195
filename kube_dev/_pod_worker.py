"""One pod on the stand-in node, from its first container start to its deletion.

Task ownership: `run()` is the worker's main task; it starts the containers task (init containers one after
another, then one task per container) and the publisher task. Only these tasks touch `self._state` and
`self._procs`; the kubelet's sync loop only calls `update()` and `gone()`, which set events. Deletion
follows the kubelet's order: stop every container within the grace period, then delete the pod with grace 0
so that the apiserver lets it go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from kube_dev._context import NodeContext
from kube_dev._convention import NO_COMMAND, container_argv
from kube_dev._environment import container_env
from kube_dev._objects import Container, Pod
from kube_dev._probes import FIRST_SUCCESS_POLL, probe_once
from kube_dev._process import ContainerProcess
from kube_dev._status import ContainerState, PodState
from pool import KubeApi, KubeApiError, RuntimeFailure

__all__ = ["PodWorker", "finish_deletion"]

logger = logging.getLogger("kubelet")

_MAX_GRACE = 30.0
_MAX_BACKOFF = 10.0


class PodWorker:
    """Runs the containers of one pod as host processes and keeps its status current."""

    def __init__(self, pod: Pod, node: NodeContext) -> None:
        self.pod = pod
        self._node = node
        self._state = PodState(
            [ContainerState(c.name, c.image) for c in pod.spec.init_containers],
            [ContainerState(c.name, c.image) for c in pod.spec.containers],
        )
        self._procs: dict[str, ContainerProcess] = {}  # container name → its running process
        self._end = asyncio.Event()  # deleted or gone: stop the pod
        self._gone = asyncio.Event()  # gone from the server (or the node shuts down): no API calls for it
        self._stopping = asyncio.Event()  # set once: no container starts or restarts after it
        self._dirty = asyncio.Event()  # the status changed since it was last sent
        self._dir = node.layout.pods / f"{pod.metadata.namespace}_{pod.metadata.name}_{pod.metadata.uid[:8]}"

    def update(self, pod: Pod) -> None:
        self.pod = pod
        if pod.metadata.deletion_timestamp is not None:
            self._end.set()

    def gone(self) -> None:
        """The pod was removed from the server, or the node is shutting down: stop it, tell no one."""
        self._gone.set()
        self._end.set()

    async def run(self) -> None:
        """Run the pod until it is deleted or gone, then stop it and finish the deletion."""
        self._dir.mkdir(parents=True, exist_ok=True)
        self._state.pod_ip = self._node.addresses.allocate()
        publisher = asyncio.create_task(self._publish_loop())
        containers = asyncio.create_task(self._run_containers())
        self._dirty.set()
        try:
            await self._end.wait()
        finally:
            await self._stop(containers)
            publisher.cancel()
            self._node.addresses.release(self._state.pod_ip)
        if not self._gone.is_set():
            await finish_deletion(self._node.client, self.pod)

    async def _stop(self, containers: asyncio.Task[None]) -> None:
        self._stopping.set()
        grace = 0.0 if self._gone.is_set() else self._grace()
        await asyncio.gather(*(proc.stop(grace) for proc in list(self._procs.values())))
        try:
            async with asyncio.timeout(grace + 10.0):  # every container loop returns once stopping is set
                await containers
        except TimeoutError:
            logger.warning("pod %s: containers did not stop in time", self.pod.key)

    def _grace(self) -> float:
        seconds = self.pod.metadata.deletion_grace_period_seconds
        return min(
            float(seconds if seconds is not None else self.pod.spec.termination_grace_period_seconds), _MAX_GRACE
        )

    async def _run_containers(self) -> None:
        for container, state in zip(self.pod.spec.init_containers, self._state.init, strict=True):
            if await self._run_container(container, state, init=True) != 0 or self._stopping.is_set():
                self._finish("Failed")
                return
        self._state.initialized = True
        self._dirty.set()
        pairs = zip(self.pod.spec.containers, self._state.main, strict=True)
        codes = await asyncio.gather(*(self._run_container(c, s, init=False) for c, s in pairs))
        self._finish("Succeeded" if all(code == 0 for code in codes) else "Failed")

    def _finish(self, phase: str) -> None:
        if not self._stopping.is_set():  # a pod stopped for deletion keeps its last phase
            self._state.final_phase = "Succeeded" if phase == "Succeeded" else "Failed"
            self._dirty.set()

    async def _run_container(self, container: Container, state: ContainerState, *, init: bool) -> int:
        """Run (and restart, as the pod's restartPolicy says) one container; its last exit code."""
        policy = self.pod.spec.restart_policy
        while True:
            code = await self._run_once(container, state)
            restart = (policy == "Always" and not init) or (policy != "Never" and code != 0)
            if self._stopping.is_set() or not restart:
                return code
            state.waiting("CrashLoopBackOff", f"back-off restarting container {container.name}")
            self._dirty.set()
            if await _wait(self._stopping, min(0.5 * 2**state.restart_count, _MAX_BACKOFF)):
                return code
            state.restart_count += 1

    async def _run_once(self, container: Container, state: ContainerState) -> int:
        try:
            env = await container_env(self._node.client, self.pod, container, self._state.pod_ip)
        except (LookupError, RuntimeFailure) as exc:
            state.waiting("CreateContainerConfigError", str(exc))
            self._dirty.set()
            await _wait(self._stopping, 2.0)
            return 1
        argv = container_argv(container, self._state.pod_ip, env, str(self._dir))
        if argv is None or container.adds_capabilities:
            # A container that adds capabilities (the egress guard: NET_ADMIN) would hold them on this machine,
            # in its network namespace: never run. Its pod stays unready, as no real kubelet would leave it.
            why = "no container that adds capabilities" if argv else "agent-sandbox/sandbox-* images, or a command"
            state.waiting(NO_COMMAND, f"the stand-in kubelet runs {why}")
            self._dirty.set()
            await self._stopping.wait()
            return 0
        return await self._spawn_and_wait(container, state, argv, env)

    async def _spawn_and_wait(
        self, container: Container, state: ContainerState, argv: list[str], env: dict[str, str]
    ) -> int:
        workdir = Path(container.working_dir) if container.working_dir else self._dir
        cgroup = f"{self.pod.metadata.uid}-{container.name}-{state.restart_count}"
        log = self._dir / f"{container.name}.log"
        try:
            proc = await ContainerProcess.start(
                self._node.tracker, cgroup, argv, env=env, cwd=workdir if workdir.is_dir() else self._dir, log=log
            )
        except OSError as exc:
            state.terminated(128, "StartError", f"{argv[0]}: {exc.strerror or exc}")
            self._dirty.set()
            return 128
        if self._stopping.is_set():  # stopped while starting: `_stop` did not see this process
            await proc.stop(0.0)
        self._procs[container.name] = proc
        state.running()
        self._dirty.set()
        prober = asyncio.create_task(self._probe_loop(container, state, env))
        try:
            code = await proc.wait()
        finally:
            prober.cancel()
            self._procs.pop(container.name, None)
        state.terminated(code)
        self._dirty.set()
        logger.info("pod %s: container %s exited with %d", self.pod.key, container.name, code)
        return code

    async def _probe_loop(self, container: Container, state: ContainerState, env: dict[str, str]) -> None:
        probe = container.readiness_probe
        if probe is None:
            state.ready = True
            self._dirty.set()
            return
        await asyncio.sleep(probe.initial_delay_seconds)
        successes = failures = 0
        succeeded_once = False
        while True:
            if await probe_once(probe, container, self._state.pod_ip, env):
                successes, failures, succeeded_once = successes + 1, 0, True
            else:
                successes, failures = 0, failures + 1
            ready = successes >= probe.success_threshold or (state.ready and failures < probe.failure_threshold)
            if ready != state.ready:
                state.ready = ready
                self._dirty.set()
            await asyncio.sleep(probe.period_seconds if succeeded_once else FIRST_SUCCESS_POLL)

    async def _publish_loop(self) -> None:
        meta = self.pod.metadata
        path = f"/api/v1/namespaces/{meta.namespace}/pods/{meta.name}/status"
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            patch = {"status": self._state.to_status()}
            try:
                await self._node.client.call(
                    "PATCH", path, body=patch, content_type="application/strategic-merge-patch+json"
                )
            except KubeApiError as exc:
                if exc.status == 404:
                    return
                logger.warning("pod %s: status update failed: %s", self.pod.key, exc)
                self._dirty.set()
                await asyncio.sleep(0.5)
            except RuntimeFailure as exc:
                logger.warning("pod %s: status update failed: %r", self.pod.key, exc)
                self._dirty.set()
                await asyncio.sleep(0.5)


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Wait up to `seconds` for `event`; whether it was set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def finish_deletion(client: KubeApi, pod: Pod) -> None:
    """Delete the pod with grace 0 (only this uid): what a kubelet does once the pod's containers are stopped."""
    meta = pod.metadata
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": meta.uid}}
    try:
        await client.call("DELETE", f"/api/v1/namespaces/{meta.namespace}/pods/{meta.name}", body=body)
    except KubeApiError as exc:
        if exc.status not in (404, 409):
            logger.warning("pod %s: delete failed: %s", pod.key, exc)
    except RuntimeFailure as exc:
        logger.warning("pod %s: delete failed: %r", pod.key, exc)
