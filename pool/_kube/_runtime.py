"""The kubernetes runtime: one ReplicaSet of one pod per sandbox, reached at its pod IP.

What it does not do yet, and says so: pause (`freeze`/`thaw`) and snapshots raise `RuntimeFailure`, and
`snapshot_keeps_processes` is False, so the idle policy never tries to snapshot. Nothing of a sandbox is kept
by `stop` (`keep_files` is ignored): its files live in the pod, which goes with it. Servers inside a sandbox
must listen on the pod's address (0.0.0.0), not 127.0.0.1, to be reachable.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import msgspec

from pool._errors import PortClosed, RuntimeFailure, SandboxGone
from pool._executor_client import EXECUTOR_PORT
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._connection import in_cluster, load_kubeconfig
from pool._kube._manifest import ID_LABEL, ROLE_SELECTOR, ReplicaSetList, replica_set, replica_set_name
from pool._kube._metrics import read_metrics
from pool._kube._pods import PodWatch
from pool._runtime import RuntimeCapabilities, SandboxSpec, SandboxStats, SnapshotInfo
from pool._template_start import bring_up

__all__ = ["KubeSettings", "KubernetesRuntime", "open_kube_runtime"]

_log = logging.getLogger("pool.kubernetes")
_NOT_YET = "is not available on the kubernetes runtime yet"
_replica_sets = msgspec.json.Decoder(ReplicaSetList)


class KubeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where sandboxes go and what they run; read once at start."""

    namespace: str
    image_prefix: str = "agent-sandbox/sandbox-"  # + template name (a registry may come first)
    # The user every sandbox runs as, over its template's (and `--default-user` of its executor): for images
    # without the template's user, such as the dev cluster's, which runs executors on the host (`root`).
    sandbox_user: Literal["user", "root"] | None = None
    start_timeout: float = 120.0  # seconds from the ReplicaSet's creation until its pod is Ready
    stop_timeout: float = 60.0  # seconds until a stopped sandbox's pod is gone
    ports_timeout: float = 30.0  # seconds for the template's ports to accept connections after start
    connect_wait: float = 10.0  # seconds `open_socket` waits for a (re)starting pod to be Ready


class KubernetesRuntime:
    """Implements `pool.Runtime` with ReplicaSets in one namespace."""

    def __init__(self, api: KubeApi, settings: KubeSettings) -> None:
        self._api = api
        self._settings = settings
        self._rs_path = f"/apis/apps/v1/namespaces/{settings.namespace}/replicasets"
        self._pods = PodWatch(api, settings.namespace)
        # Sandboxes whose ReplicaSet this runtime created or recovered and has not deleted (mutated by start,
        # stop and recover on the event loop only); a set rather than the watch, so a pod being replaced by
        # its ReplicaSet still counts as running.
        self._sandboxes: set[str] = set()
        self._tokens: dict[str, str | None] = {}  # the executor's access token per sandbox, for /metrics

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(snapshot_kind="filesystem", criu_reason=f"pause and snapshots {_NOT_YET}")

    async def aclose(self) -> None:
        await self._pods.close()
        await self._api.aclose()

    async def start(self, spec: SandboxSpec) -> None:
        spec = self._as_sandbox_user(spec)
        await self._pods.start()
        body = replica_set(spec, image_prefix=self._settings.image_prefix, executor_args=self._executor_args())
        try:
            await self._api.call("POST", self._rs_path, body=body)
        except KubeApiError as exc:
            if exc.status != 409:  # 409: created by an earlier call for the same id, which this one finishes
                raise
        self._sandboxes.add(spec.sandbox_id)
        self._tokens[spec.sandbox_id] = spec.init.access_token
        try:
            await self._pods.wait_ready(spec.sandbox_id, self._settings.start_timeout)
            await bring_up(
                lambda port: self.open_socket(spec.sandbox_id, port), spec, ports_timeout=self._settings.ports_timeout
            )
        except BaseException:
            await asyncio.shield(self._discard(spec.sandbox_id))
            raise

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        await self._pods.start()
        self._sandboxes.discard(sandbox_id)
        self._tokens.pop(sandbox_id, None)
        params = {"propagationPolicy": "Background"}  # the garbage collector deletes the pods it owns
        try:
            await self._api.call("DELETE", f"{self._rs_path}/{replica_set_name(sandbox_id)}", params=params)
        except KubeApiError as exc:
            if exc.status != 404:
                raise
        await self._pods.wait_gone(sandbox_id, self._settings.stop_timeout)

    async def freeze(self, sandbox_id: str) -> None:
        self._known(sandbox_id)
        raise RuntimeFailure(f"pause {_NOT_YET}")

    async def thaw(self, sandbox_id: str) -> None:
        self._known(sandbox_id)
        raise RuntimeFailure(f"pause {_NOT_YET}")

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected, non-blocking TCP socket to `port` at the sandbox's pod IP."""
        self._known(sandbox_id)
        ip = self._pods.ready_ip(sandbox_id) or await self._pods.wait_ready(sandbox_id, self._settings.connect_wait)
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(self._settings.connect_wait):
                await asyncio.get_running_loop().sock_connect(sock, (ip, port))
        except ConnectionRefusedError as exc:
            sock.close()
            raise PortClosed(f"nothing listens on port {port} of sandbox {sandbox_id}") from exc
        except (OSError, TimeoutError) as exc:
            sock.close()
            raise RuntimeFailure(f"cannot connect to port {port} of sandbox {sandbox_id} at {ip}: {exc!r}") from exc
        return sock

    def is_running(self, sandbox_id: str) -> bool:
        return sandbox_id in self._sandboxes

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """The executor's own figures (envd's GET /metrics); `cpu_seconds` is not among them and is 0."""
        sock = await self.open_socket(sandbox_id, EXECUTOR_PORT)
        return await read_metrics(sock, self._tokens.get(sandbox_id))

    def snapshot_keeps_processes(self, sandbox_id: str) -> bool:
        return False

    async def snapshot(self, sandbox_id: str) -> SnapshotInfo:
        self._known(sandbox_id)
        raise RuntimeFailure(f"snapshots {_NOT_YET}")

    async def restore(self, spec: SandboxSpec) -> None:
        """Nothing to do for a running sandbox (its access token is noted, for `stats` after a `recover`); no
        sandbox is ever snapshotted here."""
        self._known(spec.sandbox_id)
        self._tokens[spec.sandbox_id] = spec.init.access_token

    def is_snapshotted(self, sandbox_id: str) -> bool:
        return False

    def snapshotted_ids(self) -> set[str]:
        return set()

    async def recover(self) -> set[str]:
        """The sandboxes whose ReplicaSet exists with a pod wanted (labelled with the sandbox role)."""
        await self._pods.start()
        listed = _replica_sets.decode(
            await self._api.call("GET", self._rs_path, params={"labelSelector": ROLE_SELECTOR})
        )
        found = {
            rs.metadata.labels[ID_LABEL] for rs in listed.items if ID_LABEL in rs.metadata.labels and rs.spec.replicas
        }
        self._sandboxes |= found
        return found

    def _known(self, sandbox_id: str) -> None:
        if sandbox_id not in self._sandboxes:
            raise SandboxGone(f"no sandbox {sandbox_id} in this runtime")

    async def _discard(self, sandbox_id: str) -> None:
        try:
            await self.stop(sandbox_id)
        except RuntimeFailure as exc:
            _log.warning("could not remove sandbox %s after its failed start: %s", sandbox_id, exc)

    def _executor_args(self) -> tuple[str, ...]:
        user = self._settings.sandbox_user
        return ("--default-user", user) if user else ()

    def _as_sandbox_user(self, spec: SandboxSpec) -> SandboxSpec:
        user = self._settings.sandbox_user
        if user is None:
            return spec
        init = msgspec.structs.replace(spec.init, default_user=user, default_workdir=None)
        template = msgspec.structs.replace(spec.template, user=user)
        return msgspec.structs.replace(spec, init=init, template=template)


def open_kube_runtime(
    kubeconfig: Path | None,
    environ: Mapping[str, str],
    *,
    namespace: str | None = None,
    sandbox_user: Literal["user", "root"] | None = None,
) -> KubernetesRuntime:
    """A runtime for the cluster of `kubeconfig`, or the one this process runs in (`environ` as in a pod).

    The namespace is `namespace`, else the kubeconfig context's (or the pod's), else "default".
    """
    connection = load_kubeconfig(kubeconfig) if kubeconfig is not None else in_cluster(environ)
    settings = KubeSettings(namespace=namespace or connection.namespace or "default", sandbox_user=sandbox_user)
    return KubernetesRuntime(KubeApi(connection), settings)
