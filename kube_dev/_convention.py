"""What the stand-in kubelet runs for a container: the documented image → command convention.

There is no container engine, so an image is only a name. Two cases:

- an image whose repository ends in `agent-sandbox/sandbox-<name>` (any registry or tag in front/after,
  e.g. `agent-sandbox/sandbox-base:dev` or `ghcr.io/acme/agent-sandbox/sandbox-code-interpreter-v1:1.2`)
  is a sandbox image, whose entrypoint is the executor. The stand-in runs the repo's executor with the
  Python that runs the stand-in itself (the repo's `.venv/bin/python`):
      <python> -m executor --host <pod IP> --port <ENVD_PORT> --home <pod dir> <container args…>
  The container's `command` is ignored (it is the image's entrypoint); its `args` come last, so they may
  override `--port` or add `--default-user root` (the host usually has no `user` account). `--home` gives
  each pod a home of its own (the pod's directory), as a container has, instead of the host's /root.
- any other image runs `command` + `args` verbatim on the host, as root, e.g. `["python3", "-m",
  "http.server", "--bind", "$(POD_IP)", "8080"]`. Without a `command` there is nothing to run: the
  container stays Waiting with reason `StandInNoCommand`.

Either way `$(VAR)` in command and args expands from the container's environment as in Kubernetes, the
process starts in the container's `workingDir` when that exists on the host (else in the pod's directory
under the state dir), and its output goes to `<state>/pods/<namespace>_<pod>_<uid>/<container>.log`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from kube_dev._objects import Container
from pool import ENVD_PORT

__all__ = ["NO_COMMAND", "container_argv", "expand", "is_sandbox_image"]

NO_COMMAND = "StandInNoCommand"
_SANDBOX_REPOSITORY = re.compile(r"(?:^|/)agent-sandbox/sandbox-[a-z0-9][a-z0-9._-]*$")
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _repository(image: str) -> str:
    """`registry/path/name` without `:tag` or `@digest`."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def is_sandbox_image(image: str) -> bool:
    return bool(_SANDBOX_REPOSITORY.search(_repository(image)))


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, unknown ones kept, `$$` is a literal `$`."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


def container_argv(container: Container, pod_ip: str, env: Mapping[str, str], home: str) -> list[str] | None:
    """The host command line for `container`, or None when the convention gives it none."""
    args = [expand(arg, env) for arg in container.args]
    if is_sandbox_image(container.image):
        executor = [sys.executable, "-m", "executor", "--host", pod_ip, "--port", str(ENVD_PORT), "--home", home]
        return executor + args
    if not container.command:
        return None
    return [expand(part, env) for part in container.command] + args
