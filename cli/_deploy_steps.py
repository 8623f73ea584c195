"""The steps of `agent-sandbox deploy`: put a directory's app in its sandbox, (re)start it, wait, say where.

A deploy finds the deployment by name (else creates its sandbox), uploads the files that differ from the
manifest the last deploy left in the sandbox, writes the sandbox's autostart file (`pool.AUTOSTART_FILE`:
the serving command and its port), stops the server it started before (tag `pool.AUTOSTART_TAG`), unpacks,
starts the server with `AGENT_SANDBOX_AUTOSTART=1` (so the runtime counts it as the sandbox's own and starts
it again after a files-only restore), and returns once the port answers through the gateway.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import msgspec

from cli._deploy_api import ControlPlane, Deployment
from cli._deploy_envd import Envd, sandbox_headers
from cli._deploy_errors import DeployError
from cli._deploy_source import APP_DIR, LOG_FILE, AppPlan, detect, pack, removal_list, scan
from pool import AUTOSTART_ENV, AUTOSTART_FILE, AUTOSTART_TAG, Autostart

__all__ = ["Deployer", "public_url"]

_USER = "user"  # the templates' user
_STATE_FILE = "/home/user/.config/agent-sandbox/deploy.json"
_INCOMING = "/tmp/ai-deploy"
_SERVE_WITHIN = 30.0
_STOP_WITHIN = 3.0
_PROBE_TIMEOUT = httpx.Timeout(10.0, read=5.0)


class _State(msgspec.Struct, kw_only=True):
    """What the last deploy left in the sandbox: the plan and the manifest of the files it put there."""

    kind: str
    port: int
    files: dict[str, str]


# Runs as `user` after the upload: delete what went away, unpack what changed, install the autostart file and
# the manifest last (so a failure leaves the previous manifest, and the next deploy uploads everything again).
_INSTALL = f"""set -e
mkdir -p {APP_DIR} ~/.config/agent-sandbox
cd {APP_DIR}
xargs -0 -r rm -f -- < {_INCOMING}.removed
tar -xzf {_INCOMING}.tar.gz
: > {LOG_FILE}
mv {_INCOMING}.autostart ~/{AUTOSTART_FILE}
mv {_INCOMING}.state {_STATE_FILE}
rm -f {_INCOMING}.tar.gz {_INCOMING}.removed
"""


def public_url(api_url: httpx.URL, port: int, sandbox_id: str, domain: str | None) -> str:
    """`<scheme>://<port>-<id>.<domain>[:<server port>]/`, the scheme and server port being the API's."""
    if not domain:
        raise DeployError(f"{api_url} reports no sandbox domain, so the deployment has no public URL")
    server_port = f":{api_url.port}" if api_url.port else ""
    return f"{api_url.scheme}://{port}-{sandbox_id}.{domain}{server_port}/"


class Deployer:
    """Deploys, lists and deletes deployments on one server: `api` carries the API key, `sandboxes` does not
    (requests routed into a sandbox must not hand the key to whatever serves there)."""

    def __init__(self, api: httpx.Client, sandboxes: httpx.Client, *, log: bool = True) -> None:
        self._plane = ControlPlane(api)
        self._api_url = api.base_url
        self._sandboxes = sandboxes
        self._log = log

    def deploy(self, directory: Path, name: str, port: int | None) -> str:
        """Create or update the deployment `name` from `directory`; its public URL once it answers."""
        plan = detect(directory, port)
        existing = self._plane.find(name)
        if existing is not None:
            plan = detect(directory, _same_port(existing, port))
            _same_template(existing, plan)
            sandbox = self._plane.connect(existing.sandbox_id)
            self._say(f"updating {name} in sandbox {sandbox.sandbox_id}")
        else:
            sandbox = self._plane.create(name, plan.template, plan.port)
            self._say(f"created sandbox {sandbox.sandbox_id} ({plan.template}) for {name}")
        with Envd(self._sandboxes.base_url, sandbox.sandbox_id, sandbox.access_token, user=_USER) as envd:
            self._install(envd, directory, plan)
            envd.start(plan.command(), tag=AUTOSTART_TAG, envs={AUTOSTART_ENV: "1"})
            self._say(f"started ({plan.kind}): {plan.serve}, port {plan.port}")
            try:
                self._wait_serving(envd, sandbox.sandbox_id, plan.port)
            except DeployError as exc:
                raise DeployError(f"{exc} (fix it and deploy again, or: agent-sandbox deploy --delete {name})") from exc
        return public_url(self._api_url, plan.port, sandbox.sandbox_id, sandbox.domain)

    def _install(self, envd: Envd, directory: Path, plan: AppPlan) -> None:
        old = _previous(envd)
        files = scan(directory)
        changed = sorted(path for path, digest in files.items() if old.get(path) != digest)
        removed = sorted(path for path in old if path not in files)
        archive = pack(directory, changed)
        autostart = Autostart(command=plan.command(), ports=[plan.port])
        envd.upload({
            f"{_INCOMING}.tar.gz": archive, f"{_INCOMING}.removed": removal_list(removed),
            f"{_INCOMING}.autostart": msgspec.json.encode(autostart),
            f"{_INCOMING}.state": msgspec.json.encode(_State(kind=plan.kind, port=plan.port, files=files)),
        })  # fmt: skip
        self._say(f"uploaded {len(changed)} changed file(s) ({len(archive)} bytes packed), removed {len(removed)}")
        _stop(envd)
        code, output = envd.run(_INSTALL)
        if code != 0:
            raise DeployError(f"unpacking in the sandbox failed (exit {code}): {_one_line(output)}")

    def _wait_serving(self, envd: Envd, sandbox_id: str, port: int) -> None:
        """Return once the port answers through the gateway; DeployError (with the log's tail) when the server
        exits or stays silent."""
        deadline = time.monotonic() + _SERVE_WITHIN
        checked = time.monotonic()
        while time.monotonic() < deadline:
            try:
                response = self._sandboxes.get("/", headers=sandbox_headers(sandbox_id, port), timeout=_PROBE_TIMEOUT)
            except httpx.ReadTimeout:
                return  # connected and slow to answer: it listens, which is all this waits for
            if response.status_code != 502:  # 502 is the gateway's "port is not open"
                return
            if time.monotonic() - checked > 0.5:
                checked = time.monotonic()
                if not envd.tagged(AUTOSTART_TAG):
                    raise DeployError(f"the server exited: {_log_tail(envd)}")
            time.sleep(0.05)
        raise DeployError(
            f"nothing answered on port {port} within {_SERVE_WITHIN:g} s (does the app listen on $PORT?): "
            f"{_log_tail(envd)}"
        )

    def deployments(self) -> list[tuple[Deployment, str]]:
        """Every deployment with its public URL."""
        return [
            (d, public_url(self._api_url, d.port, d.sandbox_id, self._plane.domain(d.sandbox_id)))
            for d in self._plane.deployments()
        ]

    def delete(self, name: str) -> Deployment:
        """Delete the deployment `name` (its sandbox and files); DeployError when there is none."""
        existing = self._plane.find(name)
        if existing is None:
            raise DeployError(f"there is no deployment named {name!r} (agent-sandbox deploy --list shows them)")
        self._plane.delete(existing.sandbox_id)
        return existing

    def _say(self, line: str) -> None:
        if self._log:
            print(line, flush=True, file=sys.stderr)


def _same_port(existing: Deployment, port: int | None) -> int:
    if port is not None and port != existing.port:
        raise DeployError(
            f"deployment {existing.name!r} serves port {existing.port}, not {port}: its URL names the port "
            "(delete it to deploy on another port)"
        )
    return existing.port


def _same_template(existing: Deployment, plan: AppPlan) -> None:
    if existing.template != plan.template:
        raise DeployError(
            f"deployment {existing.name!r} runs on template {existing.template}; this {plan.kind} app needs "
            f"{plan.template} (delete the deployment first)"
        )


def _previous(envd: Envd) -> dict[str, str]:
    """The manifest of the files the last deploy put in the sandbox (none when unreadable)."""
    raw = envd.read(_STATE_FILE)
    if raw is None:
        return {}
    try:
        return msgspec.json.decode(raw, type=_State).files
    except msgspec.DecodeError:
        return {}


def _stop(envd: Envd) -> None:
    """End the server the last deploy (or a restore) started: SIGTERM, then SIGKILL; wait until it is gone."""
    for signal, within in (("SIGTERM", _STOP_WITHIN), ("SIGKILL", _STOP_WITHIN)):
        if not envd.tagged(AUTOSTART_TAG):
            return
        envd.signal(AUTOSTART_TAG, signal)
        deadline = time.monotonic() + within
        while envd.tagged(AUTOSTART_TAG) and time.monotonic() < deadline:
            time.sleep(0.05)
    if envd.tagged(AUTOSTART_TAG):
        raise DeployError("the previous server did not stop after SIGKILL")


def _log_tail(envd: Envd) -> str:
    log = envd.read(LOG_FILE) or b""
    tail = _one_line(log.decode(errors="replace"))
    return f"its log ({LOG_FILE}) ends: {tail}" if tail else f"its log ({LOG_FILE}) is empty"


def _one_line(text: str, keep: int = 400) -> str:
    """The end of `text` on one line (lines joined with ' | '), at most `keep` characters."""
    joined = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return joined[-keep:]
