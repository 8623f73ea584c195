"""The E2B Template SDK's build request turned into a `pool.Template`: its base, then one layer per step.

The SDK sends its builder calls as steps (`RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`; e2b-features.md §1.1):
`apt_install`, `pip_install` and `npm_install` arrive as RUN strings, and each becomes a `RunLayer` built in a
build sandbox as the step's user. ENV changes the environment of the steps after it and of the template's
sandboxes; WORKDIR and USER make the directory or the user (as E2B does) and apply to what follows. Each
layer carries the SDK's step number as its label, so a failure points at the user's own line; the base's
layers are labelled `base`. A step with `force` (`skip_cache`) gets the build's id in its identity, so it and
every layer above it are built again.

Bases: `e2bdev/base`, `debian:<suite>`, `python:3.11|3.13` and `node:*` are built here from Debian's archive
(no registry needed); any other image, and any image given with registry credentials, is pulled from its
registry (`pool.OciLayer`, pinned to a digest when the build starts), followed by E2B's user step: `user`
(uid 1000 where free, home /home/user) made with the image's useradd in a build sandbox. Its working
directory stays "" in the plan, for the build to fill in with the image's WorkingDir. Credentials
(`fromImageRegistry` of type `registry`) travel in the plan to the pull only; `aws` and `gcp` are refused.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Annotated, Literal

import msgspec

from activator._errors import ActivatorError, InvalidRequest
from activator._template_builds import BuildPlan
from pool import (
    SANDBOX_PATH,
    CopyLayer,
    DebootstrapLayer,
    Layer,
    OciLayer,
    RegistryLogin,
    Resources,
    RunLayer,
    Template,
)

__all__ = ["BASE_STEP", "FINALIZE_STEP", "BaseRefused", "BuildStart", "BuildStep", "plan_build"]

BASE_STEP, FINALIZE_STEP = "base", "finalize"
MAX_STEPS = 500

_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# Debian suites a `debian:<tag>` base can be: the archive mirror serves each (`stable` is trixie in 2026).
_DEBIAN_SUITES = {
    "12": "bookworm", "bookworm": "bookworm", "13": "trixie", "trixie": "trixie", "stable": "trixie",
    "latest": "trixie", "sid": "sid", "unstable": "sid",
}  # fmt: skip
_PYTHON_SUITES = {"3.11": "bookworm", "3.13": "trixie", "3": "trixie", "latest": "trixie"}
E2B_BASE = "sandbox-base-node"  # what `e2bdev/base` (and `Template()`) is here: Debian 12, Python 3.11, Node.js
# E2B's user step over a pulled image, as root in a build sandbox: `user` with uid 1000 unless the image has
# given that uid away, and the names a sandbox's loopback needs (an image's /etc/hosts is Docker's to write).
_IMAGE_SETUP = """if ! id -u user >/dev/null 2>&1; then
  if getent passwd 1000 >/dev/null; then uid=""; else uid="--uid 1000"; fi
  if getent group user >/dev/null; then group="-g user"; else group="--user-group"; fi
  useradd --create-home $uid $group --shell /bin/bash user
fi
mkdir -p /home/user && chown user: /home/user
grep -qs localhost /etc/hosts || printf '127.0.0.1 localhost sandbox\\n::1 localhost\\n' >> /etc/hosts
echo sandbox > /etc/hostname"""


class BuildStep(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    type: Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"]
    args: list[str] = []
    force: bool = False
    files_hash: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")] | None = None
    force_upload: bool | None = None


class BuildStart(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    """The body of `POST /v2/templates/{templateID}/builds/{buildID}`."""

    from_image: str | None = None
    from_template: str | None = None
    from_image_registry: dict[str, object] | None = None
    force: bool = False
    steps: Annotated[list[BuildStep], msgspec.Meta(max_length=MAX_STEPS)] = []
    start_cmd: str | None = None
    ready_cmd: str | None = None


class BaseRefused(Exception):
    """The base cannot be had here: the build fails at step `base` with this message."""


def plan_build(
    body: BuildStart, *, name: str, build_id: str, resources: Resources, resolve: Callable[[str], Template]
) -> BuildPlan:
    """The template `body` describes, named `name`; BaseRefused when its base is not available here,
    InvalidRequest when a step is malformed. `resolve` finds a template reference (`from_template`)."""
    base, notes, login = _base(body, resolve)
    user, workdir, env = base.user, base.workdir, dict(base.env)
    layers: list[Layer] = list(base.layers)
    labels = [BASE_STEP] * len(layers)
    for number, step in enumerate(body.steps, start=1):
        nonce = build_id if step.force or body.force else ""
        added: Layer | None = None
        match step.type:
            case "RUN":
                script = _arg(step, 0, number)
                as_user = step.args[1] if len(step.args) > 1 and step.args[1] else user
                added = RunLayer(script=script, user=_user(as_user, number), workdir=workdir, env=env, rebuild=nonce)
            case "COPY":
                if step.files_hash is None:
                    raise InvalidRequest(f"step {number}: COPY needs its filesHash")
                owner = step.args[2] if len(step.args) > 2 and step.args[2] else user
                added = CopyLayer(
                    files=step.files_hash, source=_arg(step, 0, number), dest=_arg(step, 1, number),
                    user="" if owner == "root" else _user(owner, number),
                    mode=_mode(step.args[3] if len(step.args) > 3 else "", number), workdir=workdir, rebuild=nonce,
                )  # fmt: skip
            case "ENV":
                if not step.args or len(step.args) % 2:
                    raise InvalidRequest(f"step {number}: ENV needs name and value pairs")
                for key, value in zip(step.args[::2], step.args[1::2], strict=True):
                    env = {**env, key: _expand(value, env, user)}
            case "WORKDIR":
                workdir = _arg(step, 0, number)
                owned = "" if user == "root" else f" && chown {shlex.quote(user)}: {shlex.quote(workdir)}"
                added = RunLayer(script=f"mkdir -p {shlex.quote(workdir)}{owned}", rebuild=nonce)
            case "USER":
                user = _user(_arg(step, 0, number), number)
                q = shlex.quote(user)
                added = RunLayer(script=f"id -u {q} >/dev/null 2>&1 || useradd -m -s /bin/bash {q}", rebuild=nonce)
        if added is not None:
            layers.append(added)
            labels.append(str(number))
    start = (*base.start, *((body.start_cmd,) if body.start_cmd else ()))
    template = msgspec.structs.replace(
        base, name=name, description="", layers=tuple(layers), env=env, start=start, user=user, workdir=workdir,
        ready=body.ready_cmd or base.ready, resources=resources, warm=0, image="",
    )  # fmt: skip
    return BuildPlan(template=template, labels=tuple(labels), notes=notes, registry=login)


def _base(
    body: BuildStart, resolve: Callable[[str], Template]
) -> tuple[Template, tuple[str, ...], RegistryLogin | None]:
    if body.from_image_registry is not None:
        login = _login(body.from_image or "", body.from_image_registry)
        return (*_pulled(body.from_image or ""), login)
    if body.from_template is not None:
        try:
            base = resolve(body.from_template)
        except ActivatorError as exc:
            raise BaseRefused(str(exc)) from exc
        if base.memory_image:  # its files are in the memory image, not in layers a build could stand on
            raise BaseRefused(
                f"template {body.from_template!r} is a snapshot with memory: build from a snapshot taken with "
                "mode='filesystem'"
            )
        return base, (f"base: template {body.from_template!r}",), None
    return (*_built_in(body.from_image or "e2bdev/base", resolve), None)


def _built_in(image: str, resolve: Callable[[str], Template]) -> tuple[Template, tuple[str, ...]]:
    """The base this server makes from Debian's archive for E2B's usual images, else the image pulled."""
    repository, _, tag = image.partition(":")
    tag = tag or "latest"
    if repository == "e2bdev/base":
        return resolve(E2B_BASE), (f"base: {image} is the built-in template {E2B_BASE!r} (Debian 12, Python 3.11, "
                                   "Node.js and npm from Debian)",)  # fmt: skip
    if repository in ("debian", "python"):
        suites = _DEBIAN_SUITES if repository == "debian" else _PYTHON_SUITES
        version = tag.split("-")[0] if repository == "debian" else ".".join(tag.split("-")[0].split(".")[:2])
        suite = suites.get(version)
        if suite is None:
            return _pulled(image)
        return _debian(resolve("base"), suite), (f"base: {image} is a Debian {suite} root made by debootstrap "
                                                 "with python3, pip and venv from Debian",)  # fmt: skip
    if repository == "node":
        return resolve(E2B_BASE), (f"base: {image} is the built-in template {E2B_BASE!r}: Debian 12's Node.js "
                                   "(18) and npm, whatever version the tag asks for",)  # fmt: skip
    return _pulled(image)


def _pulled(image: str) -> tuple[Template, tuple[str, ...]]:
    """`image` from its registry, then E2B's user step; BaseRefused when it is no image reference."""
    try:
        layer = msgspec.convert({"kind": "oci", "image": image}, OciLayer)
    except msgspec.ValidationError as exc:
        raise BaseRefused(_unavailable(image, "a reference not of the form [registry/]repository[:tag]")) from exc
    template = Template(
        name="", description="", layers=(layer, RunLayer(script=_IMAGE_SETUP)), env={}, start=(), ports=(),
        user="user", workdir="", resources=Resources(), warm=0, pause_after=None, snapshot_after=None,
    )  # fmt: skip
    return template, (f"base: {image} is pulled from its registry and unpacked here, then gets E2B's user `user`",)


def _login(image: str, registry: dict[str, object]) -> RegistryLogin:
    """The credentials of `fromImageRegistry`: only the generic `registry` type's username and password."""
    kind = registry.get("type")
    if kind != "registry":
        raise BaseRefused(_unavailable(image, f"a registry of type {kind!r} (its cloud credentials)"))
    username, password = registry.get("username"), registry.get("password")
    if not isinstance(username, str) or not isinstance(password, str) or not username:
        raise BaseRefused(_unavailable(image, "a registry login without a username and password"))
    return RegistryLogin(username=username, password=password)


def _debian(base: Template, suite: str) -> Template:
    """`base` with its Debian root made of another suite (same packages, no layer above it)."""
    root = base.layers[0]
    assert isinstance(root, DebootstrapLayer)
    return msgspec.structs.replace(base, layers=(msgspec.structs.replace(root, suite=suite),))


def _unavailable(image: str, what: str) -> str:
    return (
        f"image {image!r} is not available on this server ({what} is not supported); bases that work here: "
        "e2bdev/base (Template()), debian:bookworm|trixie|sid (12, 13, stable), python:3.11|3.13, node:<any> "
        "(Debian's Node.js), images from registries this server reaches, and from_template(<a built-in or your "
        "own template>)"
    )


_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


def _expand(value: str, env: dict[str, str], user: str) -> str:
    """An ENV value with `$NAME` / `${NAME}` replaced as a shell would (E2B evaluates them): by the env so far,
    else the sandbox's own PATH and HOME, else nothing. Command substitutions are left as they are."""
    defaults = {"PATH": SANDBOX_PATH, "HOME": "/root" if user == "root" else f"/home/{user}"}

    def value_of(match: re.Match[str]) -> str:
        name = match["braced"] or match["bare"]
        return env.get(name, defaults.get(name, ""))

    return _VARIABLE.sub(value_of, value)


def _arg(step: BuildStep, index: int, number: int) -> str:
    if len(step.args) <= index or not step.args[index]:
        raise InvalidRequest(f"step {number}: {step.type} needs argument {index + 1}")
    return step.args[index]


def _user(name: str, number: int) -> str:
    if not _USER.match(name):
        raise InvalidRequest(f"step {number}: {name!r} is not a user name useradd accepts")
    return name


def _mode(mode: str, number: int) -> str:
    if mode and not re.fullmatch(r"[0-7]{3,4}", mode):
        raise InvalidRequest(f"step {number}: COPY mode {mode!r} is not an octal mode")
    return mode
