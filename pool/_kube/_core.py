"""Sandboxes as ReplicaSets of one pod: start, stop, pause and reach them, whichever replica created them.

`KubeSandboxes` keeps no sandbox of its own: which sandboxes exist, run or are snapshotted comes from the
watched ReplicaSets (`_replicasets`), and their pods' IPs from the watched pods (`_pods`), so every gateway
replica sharing the namespace can act on every sandbox. A sandbox another replica created a moment ago and
the watch has not shown yet is looked up once with a GET before it counts as gone.

What the cluster does not hold is the access token of each sandbox's executor (never in objects): it is
noted from `start`, `restore` and `note_spec`, and the activator calls `note_spec` before acting on a sandbox
it did not start in this process. A call without it gets the executor's 401 as a `RuntimeFailure` that says so.

Pause is the executor's own (`POST /agent-sandbox/freeze`): it SIGSTOPs every process of the sandbox but
itself; memory stays, CPU is zero, the pod stays, and its API still answers (thaw, files, metrics).
Egress rules other than the default are a NetworkPolicy of the sandbox's own plus a label on its pods
(`_egress`), put in place at `start` and replaced by `set_egress`; with an egress guard in its pods (`_guard`),
every sandbox's rules are also sent to its guard, which enforces them whatever the CNI does.
`KubernetesRuntime` (`_runtime`) adds snapshots and the recovery after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any, Literal

import msgspec

from executor.envd import ENVD_PORT
from pool._errors import RuntimeFailure, SandboxGone
from pool._executor_client import freeze, thaw
from pool._kube._api import KubeApi, KubeApiError
from pool._kube._archive import ARCHIVE_LIMIT
from pool._kube._calls import connect, delete
from pool._kube._census import ProcessCensus, template_only
from pool._kube._egress import DOMAINS_UNENFORCED, EgressPolicies
from pool._kube._guard_client import GuardKey, put_rules
from pool._kube._guard_wire import GUARD_PORT, GuardRefused
from pool._kube._manifest import EgressGuard, ReplicaSet, replica_set
from pool._kube._metrics import read_metrics
from pool._kube._pods import PodWatch
from pool._kube._pool_manifest import MERGE_PATCH, runs_claimed_warm_pod
from pool._kube._replicasets import ReplicaSetWatch, is_running
from pool._kube._shapes import EGRESS_LABEL, OWN_EGRESS, replica_set_name
from pool._runtime import EgressRules, ExecutorInit, SandboxSpec, SandboxStats
from pool._template_start import Connect, bring_up

__all__ = ["KubeSandboxes", "KubeSettings"]

_log = logging.getLogger("pool.kubernetes")
_replica_set = msgspec.json.Decoder(ReplicaSet)


class KubeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where sandboxes go and what they run; read once at start."""

    namespace: str
    image_prefix: str = "agent-sandbox/sandbox-"  # + template name (a registry may come first)
    # The user every sandbox runs as, over its template's (and `--default-user` of its executor): for images
    # without the template's user, such as the dev cluster's, which runs executors on the host (`root`).
    sandbox_user: Literal["user", "root"] | None = None
    start_timeout: float = 120.0  # seconds from the ReplicaSet's creation (or scale-up) until its pod is Ready
    stop_timeout: float = 60.0  # seconds until a stopped (or snapshotted) sandbox's pod is gone
    ports_timeout: float = 30.0  # seconds for the template's ports to accept connections after start
    connect_wait: float = 10.0  # seconds `open_socket` waits for a (re)starting pod to be Ready
    census_max_age: float = 30.0  # seconds a running sandbox's process census is trusted (`_census`)
    archive_limit: int = ARCHIVE_LIMIT  # compressed bytes of working directory a snapshot keeps at most
    service_account: str | None = None  # the sandbox pods' ServiceAccount (None: the namespace's default)
    # The egress guard in every sandbox pod (`_guard`), which enforces the egress rules whatever the CNI does with
    # NetworkPolicies; None: the NetworkPolicies alone, and allowOut domains refused.
    guard: EgressGuard | None = None

    @property
    def replica_sets_path(self) -> str:
        return f"/apis/apps/v1/namespaces/{self.namespace}/replicasets"

    @property
    def executor_args(self) -> tuple[str, ...]:
        """The executor's arguments for `sandbox_user`: of sandbox pods and warm pool pods alike."""
        return ("--default-user", self.sandbox_user) if self.sandbox_user else ()

    def as_sandbox_user(self, init: ExecutorInit) -> ExecutorInit:
        """`init` with `sandbox_user` over the template's user (and its workdir, which may be that user's)."""
        user = self.sandbox_user
        return msgspec.structs.replace(init, default_user=user, default_workdir=None) if user else init


class KubeSandboxes:
    """Starts, pauses, reaches and stops the sandboxes of one namespace."""

    def __init__(self, api: KubeApi, settings: KubeSettings) -> None:
        self._api = api
        self._settings = settings
        self._rs_path = settings.replica_sets_path
        self._pods = PodWatch(api, settings.namespace)
        self._sets = ReplicaSetWatch(api, settings.namespace)
        self._census = ProcessCensus(max_age=settings.census_max_age)
        self._egress = EgressPolicies(api, settings.namespace)
        self._guard_key = GuardKey(api, settings.namespace)
        self._watching = False
        # The executor's access token per sandbox (None: it has none), from start, restore and note_spec; on
        # the event loop only. Never written anywhere: the cluster's objects do not hold secrets of the caller.
        self._tokens: dict[str, str | None] = {}

    @property
    def api(self) -> KubeApi:
        """The API client, shared with what else the server keeps in the cluster (records, leases, warm pools)."""
        return self._api

    @property
    def settings(self) -> KubeSettings:
        return self._settings

    async def aclose(self) -> None:
        await self._census.close()
        await self._pods.close()
        await self._sets.close()
        await self._api.aclose()

    def note_spec(self, spec: SandboxSpec) -> None:
        """Keep the sandbox's access token, for pause, snapshots and stats of a sandbox started elsewhere."""
        self._tokens[spec.sandbox_id] = spec.init.access_token

    async def start(self, spec: SandboxSpec) -> None:
        if spec.fork is not None:  # this runtime takes no memory image to copy: refused, never started as new
            raise RuntimeFailure(
                f"sandbox {spec.sandbox_id} is not started as a fork: Kubernetes sandboxes do not fork"
            )
        spec = self._as_sandbox_user(spec)
        await self._watch()
        if self._settings.guard is not None:
            await self._guard_key.get()  # the pod names its Secret: it exists before the pod
        body = replica_set(
            spec, image_prefix=self._settings.image_prefix, executor_args=self._settings.executor_args,
            service_account=self._settings.service_account, guard=self._settings.guard,
        )  # fmt: skip
        try:
            created: ReplicaSet | None = _replica_set.decode(await self._api.call("POST", self._rs_path, body=body))
        except KubeApiError as exc:
            if exc.status != 409:  # 409: created by an earlier call for the same id, which this one finishes
                raise
            created = None
        self.note_spec(spec)
        sandbox_id = spec.sandbox_id
        try:
            if spec.egress != EgressRules():  # its pod is labelled already: until this, it reaches only DNS
                owner = created or await self._replica_set(sandbox_id)
                await self._egress.put(sandbox_id, spec.egress, owner.metadata)
            await self._settle(sandbox_id, is_running, "its ReplicaSet to be seen")
            await self._pods.wait_ready(sandbox_id, self._settings.start_timeout)
            await self.guard_rules(sandbox_id, spec.egress)  # before the template's commands run with them
            if not runs_claimed_warm_pod(self._pods.of(sandbox_id).values()):  # a warm claim ran start and init
                await bring_up(self._connector(sandbox_id), spec, ports_timeout=self._settings.ports_timeout)
        except BaseException:
            await asyncio.shield(self._discard(sandbox_id))
            raise

    async def set_egress(self, sandbox_id: str, rules: EgressRules) -> None:
        """Replace the sandbox's own NetworkPolicy (none for the default rules) and label its pods and its pod
        template to match, in the order `_egress` explains.

        Right after a warm claim, before `start`, there is no ReplicaSet yet: only the claimed pod is labelled,
        and `start` creates the policy."""
        if rules.domains and self._settings.guard is None:
            raise RuntimeFailure(f"{DOMAINS_UNENFORCED} (sandbox {sandbox_id})")
        await self._watch()
        await self.guard_rules(sandbox_id, rules)
        own = rules != EgressRules()
        owner = await self._find(sandbox_id)
        if owner is None and not own:
            return  # a warm pod never has the label
        if owner is not None:
            if own:
                await self._egress.put(sandbox_id, rules, owner.metadata)
            label = {EGRESS_LABEL: OWN_EGRESS if own else None}
            await self._patch(sandbox_id, {"spec": {"template": {"metadata": {"labels": label}}}})
        await self._egress.label_pods(sandbox_id, own=own)
        if owner is not None and not own:
            await self._egress.delete(sandbox_id)

    async def guard_rules(self, sandbox_id: str, rules: EgressRules) -> None:
        """Have the egress guard of every live pod of the sandbox enforce `rules` (nothing without a guard).

        Ready or not: a pod whose guard is restarting would otherwise keep (and put back) older rules while the
        caller is told the new ones hold. Each guard is retried for `connect_wait`; one that does not answer for
        the rules by then fails the call. A pod without an address yet starts closed, and is told by whoever
        waits for it (`start`, `restore`)."""
        if self._settings.guard is None:
            return
        key = await self._guard_key.get()
        for pod in list(self._pods.of(sandbox_id).values()):
            if pod.status.pod_ip and pod.metadata.deletion_timestamp is None:
                await self._put_guard_rules(sandbox_id, pod.metadata.name, pod.status.pod_ip, key, rules)

    async def _put_guard_rules(self, sandbox_id: str, pod: str, ip: str, key: str, rules: EgressRules) -> None:
        what = f"the egress guard of sandbox {sandbox_id} (pod {pod})"
        clock = asyncio.get_running_loop().time
        deadline = clock() + self._settings.connect_wait
        while True:
            left = max(deadline - clock(), 0.1)
            try:
                await put_rules(await connect(ip, GUARD_PORT, left, what), key, pod, rules, within=left)
                return
            except (RuntimeFailure, GuardRefused) as exc:
                if clock() >= deadline:
                    raise RuntimeFailure(f"{what}: {exc}") from exc
            await asyncio.sleep(0.2)

    async def stop(self, sandbox_id: str, *, keep_files: bool = False) -> None:
        """Delete the ReplicaSet; the garbage collector deletes its pod and archive (`keep_files` is moot).

        Returns once its pods are gone, or after `stop_timeout` once every pod left is being deleted: ending them
        is the kubelet's from then on, and a kill that cannot be taken back does not fail for a slow kubelet (it
        is logged, with each pod's containers)."""
        await self._watch()
        await delete(self._api, self._rs_url(sandbox_id), params={"propagationPolicy": "Background"})
        self._tokens.pop(sandbox_id, None)  # kept while the sandbox may still be there: a failed stop is retried
        self._census.forget(sandbox_id)
        gone = f"the ReplicaSet of sandbox {sandbox_id} to go"
        await self._sets.wait(lambda: self._sets.get(sandbox_id) is None, self._settings.stop_timeout, gone)
        await self._delete_pods(sandbox_id)
        try:
            await self._pods.wait_gone(sandbox_id, self._settings.stop_timeout)
        except RuntimeFailure as exc:
            if any(pod.metadata.deletion_timestamp is None for pod in self._pods.live_pods(sandbox_id)):
                raise
            _log.warning("sandbox %s: stopped, but the kubelet has not ended its pods yet: %s", sandbox_id, exc)

    async def _delete_pods(self, sandbox_id: str) -> None:
        """Delete the sandbox's pods: one its ReplicaSet owns goes anyway, but a claimed warm pod no ReplicaSet
        adopted (yet) is no one's, and the garbage collector never takes it."""
        for name in list(self._pods.of(sandbox_id)):
            await delete(self._api, f"/api/v1/namespaces/{self._settings.namespace}/pods/{name}")

    async def freeze(self, sandbox_id: str) -> None:
        """SIGSTOP every process but the executor; the census taken then holds until `thaw`."""
        sock = await self.open_socket(sandbox_id, ENVD_PORT)
        with self._token_hint(sandbox_id):
            await freeze(sock, self._token(sandbox_id))
        try:
            keeps = await self._take_census(sandbox_id)
        except RuntimeFailure as exc:
            _log.info("sandbox %s: frozen, but its processes could not be listed: %s", sandbox_id, exc)
            self._census.forget(sandbox_id)
            return
        self._census.set(sandbox_id, keeps, until_forgotten=True)

    async def thaw(self, sandbox_id: str) -> None:
        sock = await self.open_socket(sandbox_id, ENVD_PORT)
        with self._token_hint(sandbox_id):
            await thaw(sock, self._token(sandbox_id))
        self._census.forget(sandbox_id)

    async def open_socket(self, sandbox_id: str, port: int) -> socket.socket:
        """A connected, non-blocking TCP socket to `port` at the sandbox's pod IP."""
        await self._watch()
        ip = self._pods.ready_ip(sandbox_id)
        if ip is None:
            found = await self._replica_set(sandbox_id)
            if found.spec.replicas < 1:
                raise SandboxGone(f"sandbox {sandbox_id} is scaled to zero")
            ip = await self._pods.wait_ready(sandbox_id, self._settings.connect_wait)
        return await connect(ip, port, self._settings.connect_wait, f"sandbox {sandbox_id}")

    def is_running(self, sandbox_id: str) -> bool:
        return self._sets.running(sandbox_id)

    async def stats(self, sandbox_id: str) -> SandboxStats:
        """The executor's own figures (envd's GET /metrics); `cpu_seconds` is not among them and is 0."""
        sock = await self.open_socket(sandbox_id, ENVD_PORT)
        with self._token_hint(sandbox_id):
            return await read_metrics(sock, self._token(sandbox_id))

    async def _watch(self) -> None:
        """Start both watches once, and return when both have their first list."""
        if not self._watching:
            await asyncio.gather(self._sets.start(), self._pods.start())
            self._watching = True

    async def _replica_set(self, sandbox_id: str) -> ReplicaSet:
        """The sandbox's ReplicaSet: as watched, or read once (created by another replica a moment ago)."""
        found = await self._find(sandbox_id)
        if found is None:
            raise self._gone(sandbox_id)
        return found

    async def _find(self, sandbox_id: str) -> ReplicaSet | None:
        """`_replica_set`, None when there is none (or it is being deleted)."""
        found = self._sets.get(sandbox_id)
        if found is None:
            try:
                found = _replica_set.decode(await self._api.call("GET", self._rs_url(sandbox_id)))
            except KubeApiError as exc:
                if exc.status != 404:
                    raise
        return None if found is None or found.deleting else found

    async def _patch(self, sandbox_id: str, patch: dict[str, Any]) -> None:
        """A JSON merge patch of the sandbox's ReplicaSet; SandboxGone when it is gone."""
        try:
            await self._api.call("PATCH", self._rs_url(sandbox_id), body=patch, content_type=MERGE_PATCH)
        except KubeApiError as exc:
            if exc.status == 404:
                raise self._gone(sandbox_id) from exc
            raise

    async def _settle(self, sandbox_id: str, state: Callable[[ReplicaSet], bool], what: str) -> None:
        """Wait until the watch shows the sandbox's ReplicaSet in `state` (after this process changed it)."""

        def reached() -> bool:
            found = self._sets.get(sandbox_id)
            return found is not None and state(found)

        await self._sets.wait(reached, self._settings.stop_timeout, f"sandbox {sandbox_id}: {what}")

    def _gone(self, sandbox_id: str) -> SandboxGone:
        return SandboxGone(f"no sandbox {sandbox_id} in namespace {self._settings.namespace}")

    def _rs_url(self, sandbox_id: str) -> str:
        return f"{self._rs_path}/{replica_set_name(sandbox_id)}"

    def _token(self, sandbox_id: str) -> str | None:
        return self._tokens.get(sandbox_id)

    @contextlib.contextmanager
    def _token_hint(self, sandbox_id: str) -> Iterator[None]:
        """A failed call to the executor of a sandbox whose token this process does not know says so (a 401,
        likely: the activator did not call `note_spec`)."""
        try:
            yield
        except RuntimeFailure as exc:
            if sandbox_id in self._tokens:
                raise
            raise RuntimeFailure(
                f"{exc} (this process knows no access token of sandbox {sandbox_id}: `note_spec` was not called)"
            ) from exc

    def _connector(self, sandbox_id: str) -> Connect:
        return functools.partial(self.open_socket, sandbox_id)

    async def _discard(self, sandbox_id: str) -> None:
        try:
            await self.stop(sandbox_id)
        except RuntimeFailure as exc:
            _log.warning("could not remove sandbox %s after its failed start: %s", sandbox_id, exc)

    def _as_sandbox_user(self, spec: SandboxSpec) -> SandboxSpec:
        user = self._settings.sandbox_user
        if user is None:
            return spec
        template = msgspec.structs.replace(spec.template, user=user)
        return msgspec.structs.replace(spec, init=self._settings.as_sandbox_user(spec.init), template=template)

    async def _take_census(self, sandbox_id: str) -> bool:
        return await template_only(await self.open_socket(sandbox_id, ENVD_PORT), self._token(sandbox_id))
