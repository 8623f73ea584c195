"""Templates: what a sandbox is made of, as data (one TOML file per template).

A template names its filesystem layers (built once into the image cache, see `_images`), the environment
and user its processes get, the commands started with it, and its resource limits. A template may name a
`parent` whose layers lie below its own and whose settings it inherits unless it sets them itself. On
Kubernetes `image` names the container image with those layers built in (`deploy/Dockerfile.sandbox-*`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from pool._template_context import ContextError, context_hash

__all__ = [
    "SANDBOXED_LAYERS",
    "AptLayer",
    "CopyLayer",
    "DebootstrapLayer",
    "Layer",
    "NpmLayer",
    "OciLayer",
    "PipLayer",
    "Resources",
    "RunLayer",
    "SnapshotLayer",
    "Template",
    "TemplateError",
    "UserName",
    "has_sandboxed_layers",
    "load_templates",
]

TemplateName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
# What `useradd` accepts on Debian (NAME_REGEX), minus the trailing `$` of machine accounts.
UserName = Annotated[str, msgspec.Meta(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]


class TemplateError(Exception):
    """A template file is invalid or its parents cannot be resolved."""


class _Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Inbound configuration: unknown keys are typos, so they are rejected."""


class _LayerConfig(_Config, kw_only=True, tag_field="kind"):
    """A layer file entry; its `kind` key says which layer it is."""


class DebootstrapLayer(_LayerConfig, kw_only=True, tag="debootstrap"):
    """A Debian root filesystem made by debootstrap: the bottom layer of every sandbox."""

    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    packages: list[str] = []
    # The suite's -updates and -security suites in its apt sources, and their packages installed at build time
    # (sid has neither): a template root is as patched as the day it was built, and `apt-get upgrade` works.
    updates: bool = True


class AptLayer(_LayerConfig, kw_only=True, tag="apt"):
    """Debian packages installed with apt-get over the layers below."""

    packages: list[str]


class PipLayer(_LayerConfig, kw_only=True, tag="pip"):
    """Python packages installed with the sandbox's own pip into a virtual environment."""

    venv: str = "/opt/venv"
    packages: list[str]


class RunLayer(_LayerConfig, kw_only=True, tag="run"):
    """A shell script run by bash in a build sandbox as `user` in `workdir` with `env`: the layer is what it changed.

    Unlike the layers above, it never runs on the host: it gets a sandbox's isolation, limits and egress.
    `rebuild` is part of the layer's identity only, so a new value (a build's id) forces it to be built again.
    """

    script: str
    user: UserName = "root"
    workdir: str = "/"
    env: dict[str, str] = {}
    rebuild: str = ""


class NpmLayer(_LayerConfig, kw_only=True, tag="npm"):
    """Node packages installed with the sandbox's npm in a build sandbox (globally by default)."""

    packages: list[str]
    global_: bool = msgspec.field(default=True, name="global")
    rebuild: str = ""


class CopyLayer(_LayerConfig, kw_only=True, tag="copy"):
    """Files from an uploaded archive (`files`: its content hash) copied into the root in a build sandbox.

    `source` is a path or glob inside the archive, `dest` where it goes (Docker's COPY rules: a directory's
    contents are copied into `dest`; a file lands in `dest` when it ends with `/` or is a directory); `user`
    owns what was copied ("" keeps root) and `mode` (octal, "" keeps the archive's) is applied to it.
    A built-in template's has no upload: `context` is its templates directory, whose `source` the archive is
    packed from at build time (`_template_context`; `files` is then that tree's hash). `context` is where the
    files are, not what they are: the layer's key says only that it has one.
    """

    files: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
    source: str
    dest: str
    user: str = ""
    mode: Annotated[str, msgspec.Meta(pattern=r"^([0-7]{3,4})?$")] = ""
    workdir: str = "/"
    rebuild: str = ""
    context: str = ""


class _FileCopyLayer(_LayerConfig, kw_only=True, tag="copy"):
    """A TOML template's `copy`: `source` is a path under its templates directory (a file or a directory, whose
    contents are copied), the rest as in `CopyLayer`."""

    source: str
    dest: str
    user: str = ""
    mode: Annotated[str, msgspec.Meta(pattern=r"^([0-7]{3,4})?$")] = ""
    workdir: str = "/"


# A container image reference as Docker spells it: [registry[:port]/]path[:tag][@sha256:digest].
_IMAGE = (
    r"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


class OciLayer(_LayerConfig, kw_only=True, tag="oci"):
    """A container image from a registry, its layers applied in order into one directory: a template's base.

    `digest` is the manifest digest (of this machine's platform) the reference was pinned to when a build
    began ("" until then), so it, not the tag, is the layer's identity: a moved tag makes a new layer, a
    pinned one never changes. Registry credentials are never part of a layer (they would be in its key, its
    record and the logs); a build passes them to the pull only.
    """

    image: Annotated[str, msgspec.Meta(pattern=_IMAGE, max_length=1000)]
    digest: Annotated[str, msgspec.Meta(pattern=r"^(sha256:[0-9a-f]{64})?$")] = ""


class SnapshotLayer(_LayerConfig, kw_only=True, tag="snapshot"):
    """A sandbox's writable layer as it was at a moment (E2B's filesystem snapshot), stored by the runtime that
    took it (`TemplateBuilder.snapshot_files`); `id` makes it a layer of its own. Nothing can build it again:
    once its directory is gone, the templates naming it cannot start."""

    id: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{32}$")]


_DefinedLayer = DebootstrapLayer | AptLayer | PipLayer | RunLayer | NpmLayer | CopyLayer | OciLayer  # what a file names
Layer = _DefinedLayer | SnapshotLayer
_FileLayer = DebootstrapLayer | AptLayer | PipLayer | RunLayer | NpmLayer | _FileCopyLayer | OciLayer  # a TOML file's
# The kinds built inside a build sandbox; the others are the operator's own and run as root in a host chroot.
SANDBOXED_LAYERS = (RunLayer, NpmLayer, CopyLayer)


def has_sandboxed_layers(template: Template) -> bool:
    """Whether building `template` needs build sandboxes (a runtime), not only the image cache."""
    return any(isinstance(layer, SANDBOXED_LAYERS) for layer in template.layers)


class Resources(_Config, kw_only=True):
    """Limits enforced with cgroups (cpu, memory, pids) and reported to clients (disk)."""

    cpu_count: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    memory_mb: Annotated[int, msgspec.Meta(ge=32)] = 512
    disk_mb: Annotated[int, msgspec.Meta(ge=64)] = 2048
    pids: Annotated[int, msgspec.Meta(ge=16)] = 1024


class _TemplateFile(_Config, kw_only=True):
    name: TemplateName
    description: str = ""
    parent: TemplateName | None = None
    layers: list[_FileLayer] = []
    env: dict[str, str] | None = None
    start: list[str] | None = None
    ports: list[Annotated[int, msgspec.Meta(ge=1, le=65535)]] | None = None
    private_ports: list[Annotated[int, msgspec.Meta(ge=1, le=65535)]] | None = None
    local_host_ports: list[Annotated[int, msgspec.Meta(ge=1, le=65535)]] | None = None
    user: UserName | None = None
    workdir: str | None = None
    ready: str | None = None
    resources: Resources | None = None
    warm: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    pause_after: Annotated[float, msgspec.Meta(gt=0)] | None = None
    snapshot_after: Annotated[float, msgspec.Meta(gt=0)] | None = None
    freeze_only: bool | None = None
    mcp_tools: list[Literal["desktop", "browser"]] | None = None
    image: str | None = None


class Template(msgspec.Struct, frozen=True, kw_only=True):
    """A resolved template: its own settings merged over its parents'."""

    name: str
    description: str
    layers: tuple[Layer, ...]
    env: dict[str, str]
    start: tuple[str, ...]
    ports: tuple[int, ...]
    user: str
    workdir: str
    resources: Resources
    warm: int
    pause_after: float | None
    snapshot_after: float | None
    # kubernetes: the container image its pods run (the layers built in, the executor its entrypoint); ""
    # means the runtime's `<image prefix><name>`. Not inherited: a child template's layers make another image.
    image: str = ""
    # A shell command that exits 0 once the start commands are ready (E2B's readyCmd): a start waits for it.
    ready: str = ""
    # Ports that need the sandbox's traffic access token even when its traffic is public (a browser's CDP port,
    # which has no authentication of its own): every sandbox of the template gets a token.
    private_ports: tuple[int, ...] = ()
    # Ports whose server answers only a local Host (Chromium's DevTools refuses any name but localhost): the
    # gateway presents `localhost:<port>` to them and rewrites that address in their JSON answers to the public one.
    local_host_ports: tuple[int, ...] = ()
    # Its sandboxes are never snapshotted to zero with their memory: a pause freezes them (resumed in
    # milliseconds, memory kept) and the idle policy stops at freezing. For stacks CRIU cannot restore yet (an X
    # desktop, Chromium): a snapshot would bring them back as a fresh start, their windows and tabs gone.
    freeze_only: bool = False
    # The kinds of MCP sandbox tools beyond the common ones (`activator._mcp`): "desktop" (screenshot, click, ...),
    # "browser" (navigate, evaluate, page_text, page_screenshot over the CDP port).
    mcp_tools: tuple[str, ...] = ()
    # A snapshot with memory (`TemplateBuilder.snapshot_memory`): the runtime's key of the memory image its
    # sandboxes are restored from, running on where the snapshotted one was; "": they start afresh.
    memory_image: str = ""


_DEFAULT = Template(
    name="",
    description="",
    layers=(),
    env={},
    start=(),
    ports=(),
    user="user",
    workdir="/home/user",
    resources=Resources(),
    warm=0,
    pause_after=None,
    snapshot_after=None,
)


def _read(path: Path) -> _TemplateFile:
    try:
        return msgspec.convert(tomllib.loads(path.read_text()), _TemplateFile)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise TemplateError(f"{path}: {exc}") from exc


def _resolve(name: str, files: dict[str, _TemplateFile], root: Path, seen: tuple[str, ...] = ()) -> Template:
    if name in seen:
        raise TemplateError(f"template {name!r}: parent cycle {' -> '.join((*seen, name))}")
    if name not in files:
        raise TemplateError(f"template {seen[-1]!r} names unknown parent {name!r}")
    own = files[name]
    base = _resolve(own.parent, files, root, (*seen, name)) if own.parent else _DEFAULT
    if not base.layers and not own.layers:
        raise TemplateError(f"template {name!r} has no layers")
    return Template(
        name=own.name,
        description=own.description,
        layers=(*base.layers, *(_defined(layer, root, name) for layer in own.layers)),
        env={**base.env, **(own.env or {})},
        start=(*base.start, *(own.start or ())),
        ports=tuple(own.ports) if own.ports is not None else base.ports,
        user=own.user or base.user,
        workdir=own.workdir or base.workdir,
        resources=own.resources or base.resources,
        warm=own.warm if own.warm is not None else base.warm,
        pause_after=own.pause_after if own.pause_after is not None else base.pause_after,
        snapshot_after=own.snapshot_after if own.snapshot_after is not None else base.snapshot_after,
        image=own.image or "",
        ready=own.ready if own.ready is not None else base.ready,
        private_ports=tuple(own.private_ports) if own.private_ports is not None else base.private_ports,
        local_host_ports=tuple(own.local_host_ports) if own.local_host_ports is not None else base.local_host_ports,
        freeze_only=own.freeze_only if own.freeze_only is not None else base.freeze_only,
        mcp_tools=tuple(own.mcp_tools) if own.mcp_tools is not None else base.mcp_tools,
    )


def load_templates(directory: Path) -> dict[str, Template]:
    """Read every `*.toml` in `directory` and resolve parents; raises `TemplateError` on any problem."""
    files: dict[str, _TemplateFile] = {}
    for path in sorted(directory.glob("*.toml")):
        tf = _read(path)
        if tf.name != path.stem:
            raise TemplateError(f"{path}: name {tf.name!r} must match the file name")
        files[tf.name] = tf
    return {name: _resolve(name, files, directory.absolute()) for name in files}


def _defined(layer: _FileLayer, root: Path, template: str) -> _DefinedLayer:
    """The layer a file's entry stands for: a `copy` names its files by their hash (read now)."""
    if not isinstance(layer, _FileCopyLayer):
        return layer
    try:
        files = context_hash(root, layer.source)
    except ContextError as exc:
        raise TemplateError(f"template {template!r}: {exc}") from exc
    except OSError as exc:
        raise TemplateError(f"template {template!r}: copy source {layer.source!r} cannot be read: {exc}") from exc
    fields = msgspec.structs.asdict(layer)
    return CopyLayer(**fields, files=files, context=str(root))
