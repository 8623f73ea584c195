"""The kubernetes runtime: one ReplicaSet of one pod per sandbox (`_core`), plus snapshots to zero and recovery.

Pause (`freeze`/`thaw`) is the executor's: it SIGSTOPs every process of the sandbox but itself, so memory stays,
CPU is zero and the pod stays (`_core`). There is no CRIU on Kubernetes (no privileged checkpointing of a
container from the gateway), so a snapshot keeps files only:

- `snapshot` downloads a tar.gz of the sandbox's working directory from its executor (at most
  `KubeSettings.archive_limit`, 64 MiB, compressed: past that it is refused and the sandbox keeps running, or
  frozen, as it was), stores it in Secrets the ReplicaSet owns (`_archive`), then in one patch records the
  archive on the ReplicaSet and scales it to 0, and waits for the pod to be gone. The archive is taken as the files are:
  the activator freezes an idle sandbox first, so they do not change meanwhile.
- `restore` reads the archive back (checked against its record), scales the ReplicaSet to 1 and, once the
  new pod is Ready, applies `/init`, unpacks the archive, runs the template's start commands, waits for its
  ports and runs the sandbox's autostart command (`pool._autostart`), as the local runtime does after a
  files-only restore. Only then is the record removed and the archive deleted. A restore cut short (the
  ReplicaSet scaled up, the record still on it) is started over in a fresh pod by the next `restore`.
  With a warm source (`set_warm_source`: the warm pools' `claim_for`), `restore` claims a warm-ready pod of
  the template for the sandbox right after the scale-up: the ReplicaSet adopts it and deletes the pod it had
  begun to start (`_claim_warm`). Its start commands ran when it was warmed and do not run again, so there the
  files come back after them, as at create. No warm pod ready: the cold path above, in the pod begun already.

An archive rather than a PersistentVolumeClaim per sandbox: it works with warm pods (a claimed pod has no
volume of its sandbox), needs no storage provisioner, and its size is bounded. What a snapshot loses: every
file outside the working directory (the executor's default workdir, else its own cwd), and every process
(the template's and the autostart command come back; nothing else does). Which sandboxes run only those is
the process census's answer (`_census`), which the idle policy asks before snapshotting.

Everything lives in the cluster (ReplicaSets, their annotations, the archive Secrets), so any replica, or
one restarted, can restore a sandbox another one snapshotted. `stop` deletes the ReplicaSet; the garbage
collector deletes its pod and archive through their ownerReferences (`keep_files` is moot: nothing is kept).
Servers inside a sandbox must listen on the pod's address (0.0.0.0), not 127.0.0.1, to be reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Literal

from executor.envd import ENVD_PORT
from pool._autostart import run_autostart
from pool._errors import RuntimeFailure, SandboxGone
from pool._executor_client import download_archive, post_init, upload_archive
from pool._kube._api import KubeApi
from pool._kube._archive import CLEARED_RECORD, ArchiveRecord, ArchiveStore
from pool._kube._connection import in_cluster, load_kubeconfig
from pool._kube._core import KubeSandboxes, KubeSettings
from pool._kube._egress import DOMAINS_UNENFORCED
from pool._kube._manifest import EgressGuard, ReplicaSet
from pool._kube._pool_manifest import runs_claimed_warm_pod
from pool._kube._replicasets import is_running, is_snapshotted
from pool._runtime import EgressRules, RuntimeCapabilities, SandboxSpec, SnapshotInfo
from pool._template_start import run_start_commands, wait_for_ports

__all__ = ["KubeSettings", "KubernetesRuntime", "WarmSource", "open_kube_runtime"]

_log = logging.getLogger("pool.kubernetes")
_NO_CRIU = (
    "no CRIU on Kubernetes: a snapshot keeps the sandbox's working directory (a tar.gz in Secrets) and starts "
    "its processes again on restore"
)

WarmSource = Callable[[str, str], Awaitable[str | None]]
"""`(template, sandbox_id) -> pod name | None`: claims a warm-ready pod of the template for the sandbox."""


class KubernetesRuntime(KubeSandboxes):
    """Implements `pool.Runtime` with ReplicaSets in one namespace, shared with any other replica."""

    def __init__(self, api: KubeApi, settings: KubeSettings) -> None:
        super().__init__(api, settings)
        self._archives = ArchiveStore(api, settings.namespace)
        self._warm_source: WarmSource | None = None

    def set_warm_source(self, claim: WarmSource | None) -> None:
        """Let `restore` first claim a warm pod (`KubeWarmPools.claim_for`); None: always a new pod."""
        self._warm_source = claim

    def capabilities(self) -> RuntimeCapabilities:
        refusal = DOMAINS_UNENFORCED if self.settings.guard is None else ""  # the guard reads the names
        return RuntimeCapabilities(snapshot_kind="filesystem", criu_reason=_NO_CRIU, domain_refusal=refusal)

    def snapshot_keeps_processes(self, sandbox_id: str) -> bool:
        """True when snapshotted, else the process census's last answer (False until it has one)."""
        if self._sets.snapshotted(sandbox_id):
            return True
        if not self._sets.running(sandbox_id):
            raise self._gone(sandbox_id)
        return self._census.answer(sandbox_id, lambda: self._take_census(sandbox_id))

    def is_snapshotted(self, sandbox_id: str) -> bool:
        return self._sets.snapshotted(sandbox_id)

    def snapshotted_ids(self) -> set[str]:
        return self._sets.ids(snapshotted=True)

    def crashes(self) -> dict[str, str]:
        """None: an executor that dies in a pod is the kubelet's to restart (the pod's restart policy)."""
        return {}

    async def snapshot(self, sandbox_id: str, *, memory: bool = True) -> SnapshotInfo:
        """Archive the working directory and scale to zero; files only here, with or without `memory`."""
        await self._watch()
        started = time.monotonic()
        found = await self._replica_set(sandbox_id)
        record = ArchiveRecord.of(found)
        if record is None:
            if not is_running(found):
                raise RuntimeFailure(f"sandbox {sandbox_id} is scaled to zero without a snapshot: its files are gone")
            record = await self._archive(found, started)
            await self._patch(sandbox_id, {"metadata": {"annotations": record.annotations()}, "spec": {"replicas": 0}})
            await self._settle(sandbox_id, is_snapshotted, "its snapshot record to be seen")
        elif found.spec.replicas:
            await self._scale(sandbox_id, 0)  # snapshotted already, but a restore was cut short: undo it
        await self._pods.wait_gone(sandbox_id, self._settings.stop_timeout)
        self._census.forget(sandbox_id)
        seconds = time.monotonic() - started
        _log.info("sandbox %s: snapshot (filesystem) in %.0f ms, %d bytes", sandbox_id, seconds * 1000, record.size)
        return SnapshotInfo(kind="filesystem", seconds=seconds, image_bytes=record.size)

    async def restore(self, spec: SandboxSpec, *, memory: bool = True) -> None:
        """A fresh pod over the archived files: a cold boot, with or without `memory` (no image is ever kept)."""
        spec = self._as_sandbox_user(spec)
        self.note_spec(spec)
        sandbox_id = spec.sandbox_id
        await self._watch()
        found = await self._replica_set(sandbox_id)
        record = ArchiveRecord.of(found)
        if record is None:
            if is_running(found):
                return
            raise SandboxGone(f"sandbox {sandbox_id} is scaled to zero without a snapshot: its files are gone")
        archive = await self._archives.load(sandbox_id, record)  # checked before anything changes
        if found.spec.replicas or self._pods.has_live_pods(sandbox_id):
            await self._scale(sandbox_id, 0)  # a restore cut short: start over in a fresh pod
            await self._delete_pods(sandbox_id)
            await self._pods.wait_gone(sandbox_id, self._settings.stop_timeout)
        await self.set_egress(sandbox_id, spec.egress)  # rules updated while it was snapshotted are in `spec`
        try:
            await self._scale(sandbox_id, 1)
            await self._claim_warm(spec)  # after the scale-up: see `_claim_warm`
            await self._pods.wait_ready(sandbox_id, self._settings.start_timeout)
            await self.guard_rules(sandbox_id, spec.egress)
            await self._bring_back(spec, archive)
        except BaseException:
            await asyncio.shield(self._back_to_zero(sandbox_id))
            raise
        await self._patch(sandbox_id, {"metadata": {"annotations": CLEARED_RECORD}})
        await self._settle(sandbox_id, is_running, "its snapshot record to go")
        self._census.forget(sandbox_id)
        await self._archives.delete(sandbox_id)

    async def recover(self) -> set[str]:
        """The running sandboxes of the namespace; the snapshotted ones are `snapshotted_ids` from here on.

        Nothing needs finishing here. A snapshot cut short before its one patch (record and zero replicas) left a
        running sandbox, and archive chunks its next snapshot replaces; after that patch it is snapshotted. A
        restore cut short left a snapshotted sandbox scaled up, which the next `restore` starts over (or
        `snapshot` scales down). A ReplicaSet scaled to zero without a record (by someone else) is neither: its
        files are gone; it is logged, and `stop` still deletes it.
        """
        await self._watch()
        for sandbox_id, found in self._sets.groups():
            if any(not rs.spec.replicas and not is_snapshotted(rs) and not rs.deleting for rs in found.values()):
                _log.warning("sandbox %s: its ReplicaSet is scaled to zero without a snapshot", sandbox_id)
        return self._sets.ids(snapshotted=False)

    async def _archive(self, found: ReplicaSet, started: float) -> ArchiveRecord:
        """The sandbox's working directory, downloaded and stored in its archive Secrets."""
        sandbox_id = found.sandbox_id or ""
        sock = await self.open_socket(sandbox_id, ENVD_PORT)
        with self._token_hint(sandbox_id):
            limit = self._settings.archive_limit
            try:
                archive = await download_archive(sock, self._token(sandbox_id), limit=limit)
            except RuntimeFailure as exc:
                raise RuntimeFailure(
                    f"sandbox {sandbox_id} was not snapshotted and runs on (its working directory may take at most "
                    f"{limit / (1 << 20):g} MiB compressed): {exc}"
                ) from exc
        return await self._archives.save(found, archive, seconds=time.monotonic() - started)

    async def _claim_warm(self, spec: SandboxSpec) -> None:
        """Move a warm pod into the sandbox scaled up a moment ago: its ReplicaSet adopts it and, with two pods
        for one replica, deletes the one it started meanwhile (not Ready yet, so ranked first to go).

        Not before the scale-up: a ReplicaSet still at zero replicas adopts the pod and deletes it at once."""
        if self._warm_source is None:
            return
        pod = await self._warm_source(spec.template.name, spec.sandbox_id)
        if pod is not None:
            _log.info("sandbox %s: resuming into warm pod %s", spec.sandbox_id, pod)
            await self._egress.label_pods(spec.sandbox_id, own=spec.egress != EgressRules())

    async def _bring_back(self, spec: SandboxSpec, archive: bytes) -> None:
        """/init, the files, the template's start commands (unless a warm pod ran them) and ports, then the
        sandbox's autostart command."""
        connect = self._connector(spec.sandbox_id)
        token = spec.init.access_token
        warm = runs_claimed_warm_pod(self._pods.of(spec.sandbox_id).values())
        await post_init(await connect(ENVD_PORT), spec.init, None)  # a warm pod has no token yet either
        await upload_archive(await connect(ENVD_PORT), token, archive)
        if not warm:
            await run_start_commands(connect, spec)
        await wait_for_ports(connect, spec.template, within=self._settings.ports_timeout)
        await run_autostart(connect, spec, ports_timeout=self._settings.ports_timeout)

    async def _scale(self, sandbox_id: str, replicas: int) -> None:
        await self._patch(sandbox_id, {"spec": {"replicas": replicas}})
        await self._settle(sandbox_id, lambda rs: rs.spec.replicas == replicas, f"{replicas} replicas to be seen")

    async def _back_to_zero(self, sandbox_id: str) -> None:
        """After a failed restore: no pod, the record and archive untouched, so it stays snapshotted."""
        with contextlib.suppress(SandboxGone):
            try:
                await self._scale(sandbox_id, 0)
                await self._delete_pods(sandbox_id)  # a claimed warm pod the ReplicaSet did not adopt
            except RuntimeFailure as exc:
                _log.warning("sandbox %s: could not scale it back to zero after a failed restore: %s", sandbox_id, exc)


def open_kube_runtime(
    kubeconfig: Path | None,
    environ: Mapping[str, str],
    *,
    namespace: str | None = None,
    sandbox_user: Literal["user", "root"] | None = None,
    service_account: str | None = None,
    guard: EgressGuard | None = None,
) -> KubernetesRuntime:
    """A runtime for the cluster of `kubeconfig`, or the one this process runs in (`environ` as in a pod).

    The namespace is `namespace`, else the kubeconfig context's (or the pod's), else "default".
    """
    connection = load_kubeconfig(kubeconfig) if kubeconfig is not None else in_cluster(environ)
    settings = KubeSettings(
        namespace=namespace or connection.namespace or "default", sandbox_user=sandbox_user,
        service_account=service_account, guard=guard,
    )  # fmt: skip
    return KubernetesRuntime(KubeApi(connection), settings)
