"""The `agent-sandbox` command: serve, manage API keys, build images, check the machine."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from activator import AGENT_SESSION_RETENTION, DEFAULT_MAX_TOTAL_BYTES, KeyLimits
from cli._deploy import DEPLOY_HELP, add_deploy_arguments, run_deploy
from cli._key_commands import LIMIT_FLAGS, key_limit, run_key_command
from cli._server_client import add_server_arguments
from gateway import ConnectionLimits, ServeSettings
from pool import HostCeiling

__all__ = ["main"]

_ENV_PREFIX = "AGENT_SANDBOX_"


def _env_default(name: str, default: object) -> object:
    value = os.environ.get(_ENV_PREFIX + name.upper().replace("-", "_"))
    return default if value is None else value


def _seconds_or_none(value: object) -> float | None:
    """A seconds flag whose default is decided later (None: not given)."""
    return None if value is None else float(str(value))


def _warm_target(text: str) -> tuple[str, int]:
    name, equals, count = text.partition("=")
    if not equals or not name or not count.isdigit():
        raise argparse.ArgumentTypeError(f"expected TEMPLATE=N, not {text!r}")
    return name, int(count)


def _warm_builds(text: str) -> int:
    if not text.isdigit() or int(text) > 100:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 100, not {text!r}")
    return int(text)


def _env_warm() -> list[tuple[str, int]]:
    value = os.environ.get(_ENV_PREFIX + "WARM", "")
    return [_warm_target(item) for item in value.split(",") if item]


def _address(text: str) -> str:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address, not {text!r}") from None


def _cidr(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address or CIDR, not {text!r}") from None


def _ca_certs(text: str) -> Path | None:
    return None if text == "none" else Path(text)


def _env_list(flag: str, convert: Callable[[str], str]) -> list[str]:
    """A repeatable flag's default from env AGENT_SANDBOX_<FLAG> as a comma-separated list."""
    value = os.environ.get(_ENV_PREFIX + flag.removeprefix("--").upper().replace("-", "_"), "")
    try:
        return [convert(item) for item in value.split(",") if item]
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"agent-sandbox: {flag} (environment): {exc}") from None


def _env_option(
    parser: argparse.ArgumentParser, flag: str, default: object, help: str | None = None, **more: Any
) -> None:
    """Add `flag`, defaulting to env AGENT_SANDBOX_<FLAG> when that is set, else to `default`."""
    parser.add_argument(flag, default=_env_default(flag.removeprefix("--"), default), help=help, **more)


def _add_common(parser: argparse.ArgumentParser) -> None:
    # fmt: off
    _env_option(parser, "--data-dir", ServeSettings().data_dir, type=Path,
        help="state: database, API key file, sandbox directories (env AGENT_SANDBOX_DATA_DIR; default %(default)s)")
    # fmt: on


def _limit(text: str) -> int:
    """A limit of the server: a count, or `none` (0) for unlimited."""
    if text == "none" or text.isdigit():
        return 0 if text == "none" else int(text)
    raise argparse.ArgumentTypeError(f"expected a number or 'none' (unlimited), not {text!r}")


def _ceiling(text: str) -> int | None:
    """A ceiling of the parent cgroup: a count, `none` (0) for no ceiling, `auto` (None) for the machine's."""
    return None if text == "auto" else _limit(text)


def _shown(value: int | None) -> str:
    return "auto" if value is None else str(value or "none")


def _add_limits(serve: argparse.ArgumentParser, defaults: ServeSettings) -> None:
    limits, ceiling = defaults.key_limits, defaults.sandboxes_ceiling
    # fmt: off
    _env_option(serve, "--key-max-sandboxes", _shown(limits.max_sandboxes), type=_limit, metavar="N|none",
        help="live sandboxes (running, paused or snapshotted) one API key may hold, where its own limit (keys "
        "create|update --max-sandboxes) leaves it to the server; past it a create gets E2B's 429 (default "
        "%(default)s)")
    _env_option(serve, "--key-max-memory-mb", _shown(limits.max_memory_mb), type=_limit, metavar="MIB|none",
        help="memory one API key's live sandboxes may declare in total, as --key-max-sandboxes (default %(default)s)")
    _env_option(serve, "--key-max-vcpus", _shown(limits.max_vcpus), type=_limit, metavar="N|none",
        help="vCPUs one API key's live sandboxes may declare in total, as --key-max-sandboxes (default %(default)s)")
    _env_option(serve, "--key-max-snapshot-mb", _shown(defaults.key_snapshot_mb), type=_limit, metavar="MIB|none",
        help="disk one API key's snapshots (create_snapshot, memory images included) may take together; past it a "
        "snapshot is refused with a 400 and nothing is kept (default %(default)s)")
    _env_option(serve, "--sandboxes-memory-max", _shown(ceiling.memory_mb), type=_ceiling, metavar="MIB|auto|none",
        help="local runtime: memory all sandboxes together may use (their parent cgroup's limit); auto: the "
        "machine's RAM less the larger of a tenth of it and 1 GiB, but at least half of it (default %(default)s)")
    _env_option(serve, "--sandboxes-pids-max", _shown(ceiling.pids), type=_ceiling, metavar="N|auto|none",
        help="local runtime: processes and threads all sandboxes together may run; auto: half of the smaller of "
        "kernel.pid_max and kernel.threads-max (default %(default)s)")
    # fmt: on


def _listen(text: str) -> tuple[str, int] | None:
    """HOST:PORT of a listener (`[v6]:PORT` too), or `none`."""
    if text == "none":
        return None
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT or 'none', not {text!r}")
    return _address(host.removeprefix("[").removesuffix("]")), int(port)


def _add_access(serve: argparse.ArgumentParser, defaults: ServeSettings) -> None:
    # fmt: off
    _env_option(serve, "--revoked-key-grace", defaults.revoked_key_grace, type=float, metavar="S",
        help="seconds a revoked key's sandboxes keep running before they are killed; the key itself is refused at "
        "once (default %(default)s)")
    _env_option(serve, "--agent-session-retention", None, type=float, metavar="S",
        help="seconds the control plane keeps a killed sandbox's coding-agent sessions readable (API, MCP, web UI); "
        f"0 deletes them with the sandbox (default {AGENT_SESSION_RETENTION:.0f}: 7 days; local runtime only, "
        "refused with --runtime kubernetes)")
    _env_option(serve, "--agent-session-space", None, type=_positive, metavar="MIB",
        help="MiB the control plane's copies of coding-agent sessions take together; past it the copies of killed "
        "sandboxes go first, the longest killed first, and then a live sandbox's copy stops growing (default "
        f"{DEFAULT_MAX_TOTAL_BYTES >> 20}; local runtime only, refused with --runtime kubernetes)")
    _env_option(serve, "--signin-failures", _shown(defaults.signin_failures), type=_limit, metavar="N|none",
        help="failed API-key checks (API, MCP, UI sign-in) one client address may make a minute; past them every "
        "check from it gets 429 + Retry-After (default %(default)s)")
    _env_option(serve, "--key-request-rate", _shown(defaults.key_request_rate), type=_limit, metavar="N|none",
        help="requests a second one API key may make (E2B API, MCP, UI sign-in, /metrics), in bursts of twice "
        "that; a request past it waits its turn, one that would wait over 10 s gets 429 + Retry-After (default "
        "%(default)s)")
    _env_option(serve, "--metrics-auth", defaults.metrics_auth, choices=["key", "none"],
        help="whether /metrics wants an API key (X-API-Key or Authorization: Bearer), default %(default)s")
    _env_option(serve, "--metrics-listen", "none", type=_listen, metavar="HOST:PORT|none",
        help="serve /metrics on a listener of its own instead of the main one, e.g. 127.0.0.1:9464 (default "
        "%(default)s)")
    # fmt: on


def _add_runtime(serve: argparse.ArgumentParser, defaults: ServeSettings) -> None:
    # fmt: off
    _env_option(serve, "--runtime", defaults.runtime, choices=["local", "kubernetes"],
        help="where sandboxes run: this machine, or ReplicaSets in a Kubernetes namespace (default %(default)s)")
    _env_option(serve, "--kubeconfig", None, type=Path,
        help="kubernetes: the kubeconfig to use (default: in-cluster, the pod's ServiceAccount)")
    _env_option(serve, "--namespace", None,
        help="kubernetes: the namespace of the sandboxes (default: the kubeconfig's or the pod's, else 'default')")
    _env_option(serve, "--kube-sandbox-user", None, choices=["user", "root"],
        help="kubernetes: run every sandbox as this user, whatever its template says (root for the dev cluster)")
    _env_option(serve, "--kube-sandbox-service-account", None, metavar="NAME",
        help="kubernetes: the ServiceAccount of sandbox pods (default: the namespace's; no token is mounted)")
    _env_option(serve, "--kube-egress-guard-image", None, metavar="IMAGE",
        help="kubernetes: run the egress guard from IMAGE (this server's own) in every sandbox pod, so that egress "
        "rules hold on any CNI and allowOut domains work (default: none; NetworkPolicies alone, domains refused)")
    _env_option(serve, "--api-key-secret", None, metavar="NAME",
        help="kubernetes: the Secret whose `api-key` is the bootstrap API key; an empty one gets a new key")
    _env_option(serve, "--redis-url", None, metavar="URL",
        help="run as one of several replicas sharing this Redis (route cache, activation locks, activity); "
        "without it this replica works alone")
    _env_option(serve, "--replica-id", defaults.replica_id,
        help="this replica's name among the others (default: $POD_NAME, else host name and pid)")
    _env_option(serve, "--lease-duration", defaults.lease_duration, type=float, metavar="S",
        help="kubernetes: seconds before another replica takes over the background loops of a dead leader "
        "(default %(default)s)")
    # fmt: on


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def _whole_seconds(text: str) -> int:
    return max(1, round(_seconds(text)))


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number from 0, not {text!r}")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1, not {text!r}")
    return int(text)


def _per_client(text: str) -> int | None:
    return None if text == "auto" else _whole(text)


def _add_connection_limits(serve: argparse.ArgumentParser, defaults: ConnectionLimits) -> None:
    # fmt: off
    _env_option(serve, "--header-timeout", defaults.header_timeout, type=_seconds, metavar="S",
        help="close a connection whose request head is not complete S seconds after it opened or the request "
        "began; never while a response is sent (default %(default)s)")
    _env_option(serve, "--body-timeout", defaults.body_timeout, type=_seconds, metavar="S",
        help="close a connection whose request body, while the server reads it, sends nothing for S seconds "
        "(default %(default)s)")
    _env_option(serve, "--keep-alive-timeout", defaults.keep_alive_timeout, type=_whole_seconds, metavar="S",
        help="close a connection idle S whole seconds after a response (default %(default)s)")
    _env_option(serve, "--max-connections", defaults.max_connections, type=_whole, metavar="N",
        help="client connections open at once; past it a new one replaces the longest idle, or is closed when "
        "none is idle; at most the fd limit less --fd-reserve (default 0: half of that)")
    _env_option(serve, "--max-connections-per-client", "auto", type=_per_client, metavar="N|auto",
        help="connections served at once per client address; past it 503 + Retry-After (auto: a quarter of "
        "--max-connections; 0: no cap, as behind a proxy, where every client shares its address; default "
        "%(default)s)")
    _env_option(serve, "--fd-reserve", defaults.fd_reserve, type=_whole, metavar="N",
        help="file descriptors client connections never take, for sandboxes, upstream sockets, SQLite and CRIU; "
        "the soft fd limit is raised to the hard one at start (default %(default)s)")
    # fmt: on


def _connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    return ConnectionLimits(
        header_timeout=args.header_timeout, body_timeout=args.body_timeout, keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections, max_connections_per_client=args.max_connections_per_client,
        fd_reserve=args.fd_reserve,
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    defaults = ServeSettings()
    parser = argparse.ArgumentParser(
        prog="agent-sandbox", description="Self-hosted, scale-to-zero sandboxes for AI agents."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run gateway, activator and pool in one process")
    # fmt: off
    _env_option(serve, "--host", defaults.host, help="listen address (default %(default)s)")
    _env_option(serve, "--port", defaults.port, type=int, help="listen port (default %(default)s)")
    _env_option(serve, "--domain", defaults.domain,
        help="sandbox hostnames are <port>-<id>.<domain> (default %(default)s)")
    _add_common(serve)
    _env_option(serve, "--image-cache", defaults.image_cache, type=Path,
        help="where built template layers are kept (default %(default)s)")
    _env_option(serve, "--templates", defaults.templates, type=Path,
        help="directory of template files (default: the templates shipped with agent-sandbox)")
    _env_option(serve, "--tls-cert", None, type=Path,
        help="serve HTTPS with this PEM certificate chain (for the E2B_DOMAIN recipe: a wildcard for *.<domain>)")
    _env_option(serve, "--tls-key", None, type=Path, help="its PEM private key")
    _env_option(serve, "--log-level", defaults.log_level, help="default %(default)s")
    _env_option(serve, "--pause-after", None, type=float, metavar="S",
        help="freeze sandboxes idle for S seconds, whatever their template says (0: never)")
    _env_option(serve, "--snapshot-after", None, type=float, metavar="S",
        help="snapshot sandboxes idle for S seconds to zero, whatever their template says (0: never)")
    _env_option(serve, "--max-held", defaults.max_held, type=int,
        help="requests held at once for waking sandboxes; past it 503 + Retry-After (default %(default)s)")
    serve.add_argument(
        "--warm", type=_warm_target, action="append", default=_env_warm(), metavar="TEMPLATE=N",
        help="keep N started sandboxes of TEMPLATE ready for creates (repeatable; env AGENT_SANDBOX_WARM=a=1,b=2)",
    )
    _env_option(serve, "--warm-builds", defaults.warm_builds, type=_warm_builds, metavar="N",
        help="local runtime: keep N (0-100) started sandboxes ready of every tagged build of the keys' own "
        "templates (default %(default)s)")
    _env_option(serve, "--hold-deadline", defaults.hold_deadline, type=float,
        help="seconds a held request waits for its sandbox; past it 504 (default %(default)s)")
    serve.add_argument("--sandbox-dns", type=_address, action="append", default=_env_list("--sandbox-dns", _address),
        metavar="IP", help="a DNS server for sandboxes' queries (repeatable; default: the host's resolv.conf)")
    serve.add_argument("--sandbox-denied-cidr", type=_cidr, action="append",
        default=_env_list("--sandbox-denied-cidr", _cidr), metavar="CIDR",
        help="never reachable from sandboxes, on top of private and link-local ranges and the host (repeatable)")
    _env_option(serve, "--sandbox-internet", "on" if defaults.sandbox_internet else "off", choices=["on", "off"],
        help="whether a sandbox created without allow_internet_access reaches the internet (E2B: on; default "
        "%(default)s)")
    _env_option(serve, "--sandbox-ca-certs", defaults.sandbox_ca_certs, type=_ca_certs, metavar="PATH|none",
        help="extra CAs sandboxes trust: a directory of *.crt or a PEM file (default %(default)s; none: off)")
    _env_option(serve, "--sandbox-disk-limit", "on" if defaults.sandbox_disk_limit else "off", choices=["on", "off"],
        help="local runtime: give each sandbox a filesystem of its template's disk_mb, so a write past it fails "
        "with ENOSPC (off: sandboxes share the data directory's filesystem unlimited; default %(default)s)")
    # fmt: on
    _add_limits(serve, defaults)
    _add_access(serve, defaults)
    _add_connection_limits(serve, defaults.connections)
    _add_runtime(serve, defaults)

    keys = commands.add_parser("keys", help="create, list, update and revoke API keys")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = key_commands.add_parser("create", help="create a key and print it (it is shown only once)")
    create.add_argument("--name", default="", help="a label for the key")
    _add_key_limits(create, "left out: the server's")
    _add_common(create)
    _add_common(key_commands.add_parser(
        "list", help="list keys: ids, names, limits, revocation (keys are stored hashed)"
    ))  # fmt: skip
    update = key_commands.add_parser("update", help="change a key's limits (a running server applies them at once)")
    update.add_argument("key_id")
    _add_key_limits(update, "left out: unchanged")
    _add_common(update)
    revoke = key_commands.add_parser(
        "revoke", help="revoke a key by id: refused at once (API, MCP, UI sessions); its sandboxes are killed after "
        "the server's --revoked-key-grace"
    )  # fmt: skip
    revoke.add_argument("key_id")
    _add_common(revoke)

    cleanup = commands.add_parser(
        "cleanup",
        help="kill every sandbox of a data directory (sandboxes outlive the server; run it stopped); volumes stay",
    )
    _add_common(cleanup)

    _add_common(commands.add_parser("doctor", help="check that this machine can run sandboxes, and how"))

    images = commands.add_parser("images", help="build template layers (the same as `templates build`)")
    _add_build(images.add_subparsers(dest="images_command", required=True), defaults)
    templates = commands.add_parser(
        "templates", help="build the built-in templates here; list or delete a running server's templates"
    )
    template_commands = templates.add_subparsers(dest="templates_command", required=True)
    _add_build(template_commands, defaults)
    add_server_arguments(template_commands.add_parser("list", help="the built-in templates and the key's own"))
    delete = template_commands.add_parser("delete", help="delete one of the key's own templates (all its builds)")
    delete.add_argument("name", help="the template's name or ID")
    add_server_arguments(delete)
    add_deploy_arguments(commands.add_parser("deploy", help=DEPLOY_HELP))
    return parser


def _add_key_limits(parser: argparse.ArgumentParser, unset: str) -> None:
    for flag, what in (("--max-sandboxes", "live sandboxes (running, paused or snapshotted) the key may hold"),
                       ("--max-memory-mb", "MiB of memory the key's live sandboxes may declare in total"),
                       ("--max-vcpus", "vCPUs the key's live sandboxes may declare in total")):  # fmt: skip
        parser.add_argument(
            flag,
            dest=LIMIT_FLAGS[flag],
            type=key_limit,
            default=argparse.SUPPRESS,
            metavar="N|none|default",
            help=f"{what}; none: unlimited, default: the server's --key-{flag[2:]} ({unset})",
        )


def _add_build(commands: Any, defaults: ServeSettings) -> None:
    build = commands.add_parser(
        "build", help="build the layers of the named built-in templates (default: all); `run`, `npm` and `copy` "
        "layers in build sandboxes"
    )  # fmt: skip
    build.add_argument("names", nargs="*")
    build.add_argument(
        "--refresh",
        action="store_true",
        help="build every layer again, under new keys, against today's archives "
        "and registries (security updates); new sandboxes get them once all are built, existing ones keep theirs",
    )
    _env_option(build, "--image-cache", defaults.image_cache, type=Path)
    _env_option(build, "--templates", defaults.templates, type=Path)
    _add_common(build)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "deploy":  # a client of a running server: no root needed
        sys.exit(run_deploy(args))
    if args.command == "templates" and args.templates_command != "build":  # a client too
        from cli._template_commands import run_template_command

        sys.exit(run_template_command(args))
    on_cluster = args.command == "serve" and args.runtime == "kubernetes"  # sandboxes are pods: no root needed
    if os.geteuid() != 0 and not on_cluster:
        sys.exit("agent-sandbox must run as root: it creates namespaces, cgroups and overlay mounts")
    match args.command:
        case "serve":
            from gateway import serve

            serve(
                ServeSettings(
                    host=args.host, port=int(args.port), domain=args.domain, data_dir=Path(args.data_dir),
                    image_cache=Path(args.image_cache), templates=Path(args.templates),
                    api_key=os.environ.get("AGENT_SANDBOX_API_KEY") or None, log_level=args.log_level,
                    tls_cert=args.tls_cert and Path(args.tls_cert), tls_key=args.tls_key and Path(args.tls_key),
                    pause_after=args.pause_after, snapshot_after=args.snapshot_after,
                    max_held=int(args.max_held), hold_deadline=float(args.hold_deadline), warm=dict(args.warm),
                    warm_builds=int(args.warm_builds), key_snapshot_mb=args.key_max_snapshot_mb,
                    runtime=args.runtime, kubeconfig=args.kubeconfig and Path(args.kubeconfig),
                    namespace=args.namespace, kube_sandbox_user=args.kube_sandbox_user,
                    kube_sandbox_service_account=args.kube_sandbox_service_account,
                    kube_egress_guard_image=args.kube_egress_guard_image or None,
                    api_key_secret=args.api_key_secret, redis_url=args.redis_url, replica_id=args.replica_id,
                    lease_duration=float(args.lease_duration), sandbox_dns=tuple(args.sandbox_dns),
                    sandbox_denied_cidrs=tuple(args.sandbox_denied_cidr), sandbox_ca_certs=args.sandbox_ca_certs,
                    sandbox_internet=args.sandbox_internet == "on", connections=_connection_limits(args),
                    key_limits=KeyLimits(max_sandboxes=args.key_max_sandboxes, max_memory_mb=args.key_max_memory_mb,
                                         max_vcpus=args.key_max_vcpus),
                    sandboxes_ceiling=HostCeiling(memory_mb=args.sandboxes_memory_max, pids=args.sandboxes_pids_max),
                    revoked_key_grace=float(args.revoked_key_grace), signin_failures=args.signin_failures,
                    agent_session_retention=_seconds_or_none(args.agent_session_retention),
                    agent_session_space_mb=args.agent_session_space,
                    key_request_rate=args.key_request_rate,
                    metrics_auth=args.metrics_auth, metrics_listen=args.metrics_listen,
                    sandbox_disk_limit=args.sandbox_disk_limit == "on",
                )
            )  # fmt: skip
        case "keys":
            run_key_command(args)
        case "cleanup":
            from gateway import cleanup

            cleanup(ServeSettings(data_dir=Path(args.data_dir)))
        case "doctor":
            from cli._doctor import doctor

            sys.exit(doctor(ServeSettings(data_dir=Path(args.data_dir))))
        case "images" | "templates":
            from cli._image_commands import build_images

            build_images(
                Path(args.templates),
                Path(args.image_cache),
                args.names,
                data_dir=Path(args.data_dir),
                refresh=args.refresh,
            )
