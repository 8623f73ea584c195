"""Everything `serve` runs, opened in order and closed in reverse: store, runtime, activator, background loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import msgspec

from activator import (
    AGENT_SESSION_RETENTION,
    DEFAULT_MAX_TOTAL_BYTES,
    Activator,
    ActivatorSettings,
    AgentArchive,
    AgentMirror,
    ApiKeys,
    Coordinator,
    KubeStore,
    McpServer,
    RedisCoordinator,
    RequestPacer,
    SandboxUrls,
    SignInLimiter,
    SoloCoordinator,
    SqliteStore,
    Store,
    TemplateBuildSource,
    TemplateFiles,
    new_sandbox_id,
)
from gateway._http_proxy import UpstreamConnection
from gateway._settings import ServeSettings
from gateway._upstream import UpstreamPool
from pool import (
    EgressGuard,
    EgressSettings,
    ExecutorInit,
    KubernetesRuntime,
    KubeWarmPools,
    LeaderElection,
    LocalRuntime,
    LocalRuntimeSettings,
    PoolError,
    Runtime,
    RuntimeCapabilities,
    Template,
    WarmPools,
    load_templates,
    open_kube_runtime,
    set_sandboxes_ceiling,
    while_leading,
)

__all__ = ["Platform", "open_platform"]

_log = logging.getLogger("agent-sandbox")


class ServerRuntime(Runtime, Protocol):
    """A runtime the server can run on: `local` or `kubernetes` (`--runtime`)."""

    def capabilities(self) -> RuntimeCapabilities: ...


class ServerWarmPools(Protocol):
    """Warm pools as the server runs them: `pool.WarmPools` here, `pool.KubeWarmPools` on a cluster."""

    async def claim(self, template: str, init: ExecutorInit) -> str | None: ...

    def forget(self, sandbox_id: str) -> bool: ...

    def stats(self) -> Mapping[str, Any]: ...

    async def run(self) -> None: ...

    async def close(self) -> None: ...


class Platform(msgspec.Struct, frozen=True, kw_only=True):
    """The running parts the app is assembled from."""

    settings: ServeSettings
    templates: dict[str, Template]
    store: Store
    keys: ApiKeys
    runtime: ServerRuntime
    activator: Activator
    upstreams: UpstreamPool[UpstreamConnection]
    mcp: McpServer
    # The warm pools' figures for /metrics (template -> `pool.WarmPoolStats`).
    warm_pool_stats: Callable[[], Mapping[str, Any]] | None = None
    # The coordinator when replicas share a Redis (--redis-url): the web UI keeps its sessions there too.
    redis: RedisCoordinator | None = None


async def _build_missing_images(runtime: LocalRuntime, templates: dict[str, Template]) -> None:
    for template in templates.values():
        if not runtime.images.is_built(template):
            _log.info("building the layers of template %r (once; later starts reuse them)", template.name)
            await runtime.build_builtin(template, _log.info)


def _make_private_dir(data_dir: Path) -> None:
    """The data dir, this user's alone (0700): it holds the state database, the API key and every sandbox's files.

    A directory someone else owns (a volume mounted there: Kubernetes makes an emptyDir root's, mode 2777 with
    the pod's fsGroup) cannot be made private, and is refused rather than used as it is."""
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        data_dir.chmod(0o700)
    except PermissionError:
        owner = data_dir.stat().st_uid
        if owner == os.getuid():
            raise
        raise SystemExit(
            f"agent-sandbox: the data dir {data_dir} belongs to uid {owner}, not to this server's uid {os.getuid()}, "
            "so it cannot be made private (0700): name a directory under it with --data-dir "
            "(the server creates it as its own)"
        ) from None


@asynccontextmanager
async def open_platform(settings: ServeSettings) -> AsyncIterator[Platform]:
    async with AsyncExitStack() as stack:
        templates = load_templates(settings.templates)
        _make_private_dir(settings.data_dir)
        runtime = await _open_runtime(stack, settings, templates)
        store: Store = (
            await KubeStore.open(runtime.api, runtime.settings.namespace)
            if isinstance(runtime, KubernetesRuntime)
            else await SqliteStore.open(settings.data_dir / "state.db")
        )
        stack.push_async_callback(store.close)
        coordinator = _coordinator(settings)
        stack.push_async_callback(coordinator.close)
        upstreams: UpstreamPool[UpstreamConnection] = UpstreamPool()
        stack.callback(upstreams.close)
        pools = _warm_pools(runtime, templates, settings)
        if isinstance(runtime, KubernetesRuntime) and isinstance(pools, KubeWarmPools):
            runtime.set_warm_source(pools.claim_for)  # a resume from zero adopts a warm pod when one is ready
        if not settings.sandbox_disk_limit and isinstance(runtime, KubernetesRuntime):
            raise SystemExit(
                "agent-sandbox: --sandbox-disk-limit off: on kubernetes a sandbox's disk is its pod's "
                "ephemeral-storage limit, which the kubelet enforces; the flag is the local runtime's"
            )
        if settings.warm_builds and isinstance(runtime, KubernetesRuntime):
            raise SystemExit("agent-sandbox: --warm-builds: the kubernetes runtime builds no templates to keep warm")
        builds = (
            TemplateBuildSource(store, runtime, TemplateFiles(settings.data_dir / "template-files"), pools)
            if isinstance(runtime, LocalRuntime) and isinstance(store, SqliteStore) and isinstance(pools, WarmPools)
            else TemplateBuildSource()  # kubernetes: a template is an image there, and no registry is configured
        )
        mirror = _agent_mirror(settings, runtime)
        activator = Activator(
            store, runtime, templates, _activator_settings(settings), on_halt=upstreams.drop,
            health_details=lambda: {"runtime": msgspec.to_builtins(runtime.capabilities())}, warm=pools,
            coordinator=coordinator, builds=builds,
            volumes=runtime.volumes if isinstance(runtime, LocalRuntime) else None,
            forker=runtime if isinstance(runtime, LocalRuntime) else None,
            watcher=mirror, agent_archive=None if mirror is None else mirror.archive,
        )  # fmt: skip
        stack.push_async_callback(activator.template_builds.close)

        async def on_exit(sandbox_id: str, why: str) -> None:
            if pools.forget(sandbox_id):  # a warm sandbox has no record to update, and nobody's files
                await runtime.stop(sandbox_id)
            else:
                await activator.sandbox_exited(sandbox_id, why)

        if isinstance(runtime, LocalRuntime):  # kubernetes: a pod that ends is replaced by its ReplicaSet
            runtime.set_exit_listener(on_exit)
        await activator.recover()
        await activator.start_coordination()
        for work in _background_loops(stack, settings, runtime, activator, pools):
            stack.push_async_callback(_cancel, asyncio.create_task(work))
        if mirror is not None:
            stack.push_async_callback(_cancel, asyncio.create_task(mirror.run(activator)))
        stack.push_async_callback(pools.close)  # runs first: stop the refills, then kill unclaimed sandboxes
        keys = ApiKeys(
            store, signin=SignInLimiter(settings.signin_failures), pacer=RequestPacer(settings.key_request_rate)
        )
        urls = SandboxUrls(domain=settings.domain, scheme="https" if settings.tls_cert else "http", port=settings.port)
        mcp = McpServer(activator, keys, urls)
        await stack.enter_async_context(mcp.run())
        yield Platform(
            settings=settings, templates=templates, store=store, keys=keys, runtime=runtime,
            activator=activator, upstreams=upstreams, mcp=mcp, warm_pool_stats=pools.stats,
            redis=coordinator if isinstance(coordinator, RedisCoordinator) else None,
        )  # fmt: skip


async def _open_runtime(
    stack: AsyncExitStack, settings: ServeSettings, templates: dict[str, Template]
) -> ServerRuntime:
    if settings.runtime == "kubernetes":
        try:
            image = settings.kube_egress_guard_image
            guard = image and EgressGuard(
                image=image, dns_servers=settings.sandbox_dns, denied=settings.sandbox_denied_cidrs
            )
            kube = open_kube_runtime(
                settings.kubeconfig, os.environ, namespace=settings.namespace, sandbox_user=settings.kube_sandbox_user,
                service_account=settings.kube_sandbox_service_account, guard=guard or None,
            )  # fmt: skip
        except PoolError as exc:
            raise SystemExit(f"agent-sandbox: --runtime kubernetes: {exc}") from exc
        stack.push_async_callback(kube.aclose)
        return kube
    local = LocalRuntime(
        LocalRuntimeSettings(
            data_dir=settings.data_dir,
            image_cache=settings.image_cache,
            executor_source=settings.executor_source,
            egress=EgressSettings(dns_servers=settings.sandbox_dns, denied=settings.sandbox_denied_cidrs),
            ca_certs=settings.sandbox_ca_certs,
            disk_limit=settings.sandbox_disk_limit,
        ),
        parent_cgroup=settings.cgroup_name,
    )
    stack.callback(local.close)
    _limit_sandboxes(settings)
    await _build_missing_images(local, templates)
    return local


def _agent_mirror(settings: ServeSettings, runtime: ServerRuntime) -> AgentMirror | None:
    """The control plane's copy of the coding-agent sessions, under the data dir (local runtime: a kubernetes
    replica's data dir is not durable, and replicas would each keep half of it)."""
    retention = settings.agent_session_retention
    if retention is not None and retention < 0:
        raise SystemExit("agent-sandbox: --agent-session-retention: seconds, 0 or more")
    space = settings.agent_session_space_mb
    if space is not None and space < 1:
        raise SystemExit("agent-sandbox: --agent-session-space: MiB, 1 or more")
    if not isinstance(runtime, LocalRuntime):
        for flag, given in (("--agent-session-retention", retention), ("--agent-session-space", space)):
            if given is not None:
                raise SystemExit(
                    f"agent-sandbox: {flag}: the kubernetes runtime keeps no copy of the coding-agent sessions (read "
                    "them from each sandbox's port 2468 while it lives)"
                )
        return None
    archive = AgentArchive(
        settings.data_dir / "agent-sessions",
        retention=AGENT_SESSION_RETENTION if retention is None else retention,
        max_total_bytes=DEFAULT_MAX_TOTAL_BYTES if space is None else space << 20,
    )
    return AgentMirror(archive, runtime.open_socket, may_hold_sessions=runtime.may_hold_agent_sessions)


def _limit_sandboxes(settings: ServeSettings) -> None:
    """The ceiling of the sandboxes' parent cgroup (`--sandboxes-memory-max`, `--sandboxes-pids-max`)."""
    try:
        memory, pids = set_sandboxes_ceiling(settings.cgroup_name, settings.sandboxes_ceiling)
    except PoolError as exc:  # e.g. sandboxes re-adopted at start already use more: they keep running
        _log.warning("the sandboxes' ceiling is not set: %s", exc)
        return
    _log.info(
        "sandboxes together may use %s of memory and %s processes",
        "any amount" if memory is None else f"{memory >> 20} MiB", pids or "any number of",
    )  # fmt: skip


def _warm_pools(runtime: ServerRuntime, templates: dict[str, Template], settings: ServeSettings) -> ServerWarmPools:
    try:
        if isinstance(runtime, KubernetesRuntime):
            return KubeWarmPools(runtime.api, runtime.settings, templates, new_id=new_sandbox_id, targets=settings.warm)
        return WarmPools(runtime, templates, new_id=new_sandbox_id, targets=settings.warm)
    except ValueError as exc:
        raise SystemExit(f"agent-sandbox: --warm: {exc}") from exc


def replica_id(settings: ServeSettings) -> str:
    """This replica's name among the others: `--replica-id`, else the pod's name, else host name and pid."""
    return settings.replica_id or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _coordinator(settings: ServeSettings) -> Coordinator:
    if settings.redis_url is None:
        return SoloCoordinator()
    try:
        return RedisCoordinator(settings.redis_url, replica_id=replica_id(settings))
    except ValueError as exc:
        raise SystemExit(f"agent-sandbox: --redis-url / --replica-id: {exc}") from exc


def _background_loops(
    stack: AsyncExitStack,
    settings: ServeSettings,
    runtime: ServerRuntime,
    activator: Activator,
    pools: ServerWarmPools,
) -> list[Coroutine[Any, Any, None]]:
    """The reaper and the warm pools' refill; on a cluster they run on the elected leader only (any replica
    may die, and two reapers would race), and every replica tells the others what is busy on it and keeps its own
    metrics history."""
    if not isinstance(runtime, KubernetesRuntime):
        return [activator.run_reaper(), pools.run(), activator.run_metrics_sampler()]
    identity = replica_id(settings)
    election = LeaderElection(
        runtime.api, runtime.settings.namespace, identity=identity, lease_duration=settings.lease_duration,
        on_change=lambda leading: _log.info(
            "replica %s %s the leader: reaper and warm pools %s here", identity,
            "is now" if leading else "is no longer", "run" if leading else "stop",
        ),
    )  # fmt: skip
    stack.push_async_callback(election.release)  # runs after the loops below are cancelled: the next leader at once
    return [
        election.run(),
        while_leading(election, activator.run_reaper),
        while_leading(election, pools.run),
        activator.run_activity_beacon(),
        activator.run_metrics_sampler(),
    ]


def _activator_settings(settings: ServeSettings) -> ActivatorSettings:
    """The lifecycle policy from the server's flags, validated (a negative threshold fails the start)."""
    values = {
        "domain": settings.domain, "pause_after": settings.pause_after, "snapshot_after": settings.snapshot_after,
        "max_held": settings.max_held, "hold_deadline": settings.hold_deadline,
        "default_internet": settings.sandbox_internet, "warm_builds": settings.warm_builds,
        "key_limits": settings.key_limits, "revoked_key_grace": settings.revoked_key_grace,
        "key_snapshot_mb": settings.key_snapshot_mb,
    }  # fmt: skip
    return msgspec.convert(values, ActivatorSettings)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
